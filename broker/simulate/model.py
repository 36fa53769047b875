"""What a replay is asked and what it answers: policies, the configuration, the result."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from policies.triggers import TriggerConfig
from providers.base import MICROS

# Job states, shared by the on-prem scheduler, the cloud model and the replay.
# NEVER: no on-prem node set can hold it and no cloud offer can (or the policy never bursts).
NEW, PENDING, ONPREM, CLOUD, DONE, NEVER = 0, 1, 2, 3, 4, 5

# Event kinds, in tie-break order at one instant: finishes free capacity before arrivals.
E_ONPREM_END, E_CLOUD_END, E_ARRIVE, E_CHECK, E_TICK = 0, 1, 2, 3, 4


@dataclass(frozen=True, slots=True)
class Policy:
    """How one simulated autoscaler bursts.

    ``market``: "none" (never bursts), "ondemand-cheapest" (lowest on-demand hourly price for
    the gang, nothing else counted), "spot-greedy" (lowest spot hourly price for interruptible
    jobs, relaunched on spot after every preemption, on-demand otherwise), "full-cost" (lowest
    full cost from :func:`policies.cost.price`, spot mixed with on-demand by
    :func:`policies.spot.decide` toward a deadline).
    """

    name: str
    market: str
    trigger: TriggerConfig = field(default_factory=TriggerConfig)
    predict: bool = False  # predict on-prem waits on every tick (policies.waits; wait trigger ahead of time)
    gate: bool = False  # diagnosis gate (allocation verdict) for the threshold trigger
    deadline_slack: float = 1.0  # cloud deadline = start-up + runtime x (1 + slack): twice the runtime
    learn_interruptions: bool = False  # update spot interruption rates from what it saw
    max_spot_attempts: int = 20  # spot-greedy gives up on spot after this many preemptions
    # With observed lifetimes, full-cost starts a job on spot only if it finishes there by its
    # deadline with this confidence (policies.spot.SpotOutlook.finish_by_h); else on-demand.
    spot_confidence: float = 0.9


NAIVE_TRIGGER = TriggerConfig(order="fifo", burst_verdicts=(), wait_trigger=False)
BROKER_TRIGGER = TriggerConfig()
# The opt-in: overdue jobs (the longest waiters) go out even when the queue is scheduling-bound.
BROKER_OVERDUE_TRIGGER = TriggerConfig(burst_overdue_when_scheduling_bound=True)


def builtin_policies() -> dict[str, Policy]:
    return {
        "onprem-only": Policy("onprem-only", "none", TriggerConfig(threshold_trigger=False, wait_trigger=False)),
        "ondemand-cheapest": Policy("ondemand-cheapest", "ondemand-cheapest", NAIVE_TRIGGER),
        "spot-greedy": Policy("spot-greedy", "spot-greedy", NAIVE_TRIGGER),
        "broker": Policy("broker", "full-cost", BROKER_TRIGGER, predict=True, gate=True,
                         learn_interruptions=True),
        "broker-burst-overdue": Policy("broker-burst-overdue", "full-cost", BROKER_OVERDUE_TRIGGER, predict=True,
                                       gate=True, learn_interruptions=True),
    }


POLICY_NAMES = tuple(builtin_policies())


# Bounds on the simulated cluster: the largest pools built today are ~100,000 GPUs, and a
# node of more than 128 GPUs is no node the scheduler models.
MAX_ONPREM_GPUS = 1_000_000
MAX_GPUS_PER_NODE = 128


@dataclass(frozen=True, slots=True)
class SimConfig:
    onprem_gpus: int
    gpus_per_node: int = 8
    tick_s: float = 60.0
    seed: int = 0
    default_gpu_model: str = "V100"
    checkpoint_minutes: int = 30  # for interruptible jobs whose trace row names none
    onprem_egress_usd_per_gb: float = 0.0
    sample_s: float = 3600.0  # time-series resolution for plots
    max_nodes: int = 1024  # the most nodes one burst may take, as the service's [limits] max_nodes

    def __post_init__(self) -> None:
        if not 0 < self.gpus_per_node <= MAX_GPUS_PER_NODE:
            raise ValueError(f"gpus_per_node must be between 1 and {MAX_GPUS_PER_NODE}, got {self.gpus_per_node}")
        if not 0 <= self.onprem_gpus <= MAX_ONPREM_GPUS:
            raise ValueError(f"onprem_gpus must be between 0 and {MAX_ONPREM_GPUS:,}, got {self.onprem_gpus}")
        if self.onprem_gpus % self.gpus_per_node:
            raise ValueError(f"onprem_gpus ({self.onprem_gpus}) must be a non-negative multiple of "
                             f"gpus_per_node ({self.gpus_per_node})")
        if self.tick_s <= 0 or self.sample_s <= 0:
            raise ValueError("tick_s and sample_s must be positive")


@dataclass(slots=True)
class PolicyResult:
    name: str
    jobs: int
    jobs_burst: int
    cloud_cost_micros: int
    lower_bound_micros: int
    cost_by_market: dict[str, int]
    cost_by_provider: dict[str, int]
    cloud_gpu_hours: float
    interruptions: int
    onprem_utilization: float
    waits: Sequence[float]  # an array of doubles from a replay
    class_waits: dict[str, Sequence[float]] = field(default_factory=dict)  # class name -> waits
    # class name -> (its target, jobs that waited past it, of which schedule first held while
    # overdue, of which no cloud offer could hold): why a class's waits pass its target
    class_past_target: dict[str, tuple[float, int, int, int]] = field(default_factory=dict)
    wall_s: float = 0.0
    cpu_s: float = 0.0  # the replay's own CPU time (wall_s less what other processes took)
    series: dict[str, list[float]] = field(default_factory=dict)
    unserved: int = 0  # jobs that never ran
    never_runnable: int = 0  # of which: bigger than the cluster, and no cloud for them
    hindsight_micros: int = 0  # each burst job on its cheapest market knowing its interruptions
    deadline_misses: int = 0  # burst jobs that finished after start-up + runtime x (1 + deadline slack)

    def percentile(self, q: float, waits: Sequence[float] | None = None) -> float:
        waits = self.waits if waits is None else waits
        if not len(waits):
            return 0.0
        w = np.sort(np.asarray(waits, dtype=np.float64))  # 8 bytes a wait, not a list of objects
        k = (len(w) - 1) * q
        lo = int(k)
        hi = min(lo + 1, len(w) - 1)
        a, b = float(w[lo]), float(w[hi])
        return a + (b - a) * (k - lo)

    def _past_target(self, c: str) -> dict:
        target, past, held, no_offer = self.class_past_target.get(c, (math.inf, 0, 0, 0))
        return {"target_s": target if math.isfinite(target) else None, "past_target": past,
                "past_target_held_by_schedule_first": held, "past_target_no_cloud_offer": no_offer}

    def to_dict(self) -> dict:
        n = len(self.waits)
        return {
            "cloud_cost_usd": round(self.cloud_cost_micros / MICROS, 2),
            "wait_p50_s": round(self.percentile(0.50), 1),
            "wait_p95_s": round(self.percentile(0.95), 1),
            "wait_p99_s": round(self.percentile(0.99), 1),
            "wait_mean_s": round(sum(self.waits) / n, 1) if n else 0.0,
            "jobs": self.jobs,
            "jobs_burst": self.jobs_burst,
            "cloud_gpu_hours": round(self.cloud_gpu_hours, 1),
            "interruptions": self.interruptions,
            "onprem_utilization": round(self.onprem_utilization, 4),
            "lower_bound_cost_usd": round(self.lower_bound_micros / MICROS, 2),
            "execution_loss_usd": round((self.cloud_cost_micros - self.lower_bound_micros) / MICROS, 2),
            "hindsight_cost_usd": round(self.hindsight_micros / MICROS, 2),
            "cost_over_hindsight": round(self.cloud_cost_micros / self.hindsight_micros, 4)
            if self.hindsight_micros else None,
            "cost_by_market_usd": {k: round(v / MICROS, 2) for k, v in sorted(self.cost_by_market.items())},
            "cost_by_provider_usd": {k: round(v / MICROS, 2) for k, v in sorted(self.cost_by_provider.items())},
            "cloud_deadline_misses": self.deadline_misses,
            "unserved_jobs": self.unserved,
            "never_runnable_jobs": self.never_runnable,
            "classes": {c: {"jobs": len(w), "wait_p50_s": round(self.percentile(0.50, w), 1),
                            "wait_p95_s": round(self.percentile(0.95, w), 1),
                            "wait_p99_s": round(self.percentile(0.99, w), 1),
                            **self._past_target(c)}
                        for c, w in sorted(self.class_waits.items())},
            "replay_jobs_per_s": round(self.jobs / self.wall_s, 1) if self.wall_s > 0 else None,
            "replay_jobs_per_cpu_s": round(self.jobs / self.cpu_s, 1) if self.cpu_s > 0 else None,
        }
