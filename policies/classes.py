"""Job classes: how long a job of each kind of service may wait before it goes to the cloud.

"Burst when the wait exceeds half the runtime" lets a job that runs for a week wait for days.
No operator signs that, so every job belongs to a class with a wait target, and the wait rule is

    burst when the predicted wait > min(wait_runtime_ratio x runtime, the class's max_wait_s)

A job with no runtime estimate uses its time limit; with neither, the class target alone.

A job's class comes from what its scheduler says (:func:`classify`): an explicit class label (a
pushed job's ``job_class``, a trace's class column), its QOS, its partition or queue, in that
order, each compared case-insensitively with every class's ``match`` names (the class's own name
when it lists none); then a numeric scheduler priority against ``min_priority``; else the
``default`` class.

Built-in classes (:data:`DEFAULT_CLASSES`), each overridable under ``[autoscaler.classes.NAME]``:

================== ========== ================================================================
class              max wait   matched by
================== ========== ================================================================
latency-sensitive  10 min     latency-sensitive, latency_sensitive, latency, ls, serving,
                              realtime, online
interactive        15 min     interactive, debug, dev, notebook
production         30 min     production, prod, critical, high
guaranteed         30 min     guaranteed, gu, reserved
default            4 h        anything else
================== ========== ================================================================

Why the named classes' targets: a cloud start-up takes minutes, so a latency-sensitive or
interactive job that would queue longer than a coffee break goes out; production and guaranteed
work gets half an hour. Why 4 hours for the default (every job the scheduler names no class for):
no job, however long it runs, should queue for days while the cloud could start it in minutes,
yet a short default buys little: on the Philly trace (512 GPUs, seed 0, observed spot
lifetimes; measured at load average 35 on 2 CPUs) a 30-minute default costs 0.55x the price-only
burst against 0.38x at 4 hours, for a p95 the price-only burst's either way (9 and 10 min)
(README, "Workloads", has the table and the one workload where 4 hours is too long). An operator
says otherwise per class (``max_wait_s``).

Pure: plain values in, plain values out.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

DEFAULT_CLASS = "default"


@dataclass(frozen=True, slots=True)
class JobClass:
    """One class of jobs and its wait target.

    - ``max_wait_s``: the longest a job of this class should wait before it bursts (inf: no
      class target, the runtime rule alone).
    - ``spot``: None lets the job's own flag decide; False keeps the class off spot capacity.
    - ``burst``: False keeps the class on-prem whatever its wait.
    - ``priority``: among jobs going out at once, higher classes go first.
    - ``match``: labels (class, QOS, partition/queue) that name this class; empty: its name.
    - ``min_priority``: a numeric scheduler priority at or above this also names it.
    """

    name: str
    max_wait_s: float = math.inf
    spot: bool | None = None
    burst: bool = True
    priority: int = 0
    match: tuple[str, ...] = ()
    min_priority: int | None = None

    def __post_init__(self) -> None:
        if not self.name or len(self.name) > 64:
            raise ValueError(f"name of a job class must be 1 to 64 characters, got {self.name!r}")
        if math.isnan(self.max_wait_s) or self.max_wait_s < 0:
            raise ValueError(f"max_wait_s must be zero or positive, got {self.max_wait_s}")
        object.__setattr__(self, "match", tuple(m.strip().lower() for m in self.match if m.strip()))

    @property
    def labels(self) -> tuple[str, ...]:
        return self.match or (self.name.lower(),)

    def describe(self) -> str:
        """``class production (target 15 min)`` for decision sentences."""
        if math.isinf(self.max_wait_s):
            return f"class {self.name} (no wait target)"
        return f"class {self.name} (target {fmt_wait(self.max_wait_s)})"


DEFAULT_CLASSES: tuple[JobClass, ...] = (
    JobClass("latency-sensitive", 600.0, priority=40,
             match=("latency-sensitive", "latency_sensitive", "latency", "ls", "serving", "realtime", "online")),
    JobClass("interactive", 900.0, priority=30, match=("interactive", "debug", "dev", "notebook")),
    JobClass("production", 1800.0, priority=20, match=("production", "prod", "critical", "high")),
    JobClass("guaranteed", 1800.0, priority=20, match=("guaranteed", "gu", "reserved")),
    JobClass(DEFAULT_CLASS, 14400.0),
)


def merge_classes(overrides: Mapping[str, JobClass], base: Sequence[JobClass] = DEFAULT_CLASSES
                  ) -> tuple[JobClass, ...]:
    """The built-in classes with the configured ones replacing those of the same name, and the
    new ones first (a configured label wins over a built-in one)."""
    by = {n.lower(): c for n, c in overrides.items()}
    base_names = {b.name.lower() for b in base}
    new = tuple(c for n, c in by.items() if n not in base_names)
    return new + tuple(by.get(b.name.lower(), b) for b in base)


def class_named(classes: Sequence[JobClass], name: str) -> JobClass:
    for c in classes:
        if c.name == name:
            return c
    return next((c for c in classes if c.name == DEFAULT_CLASS), JobClass(DEFAULT_CLASS))


def classify(classes: Sequence[JobClass], label: str = "", qos: str = "", queue: str = "",
             priority: float | None = None) -> JobClass:
    """The class of a job from its labels (see the module docstring for the order)."""
    for raw in (label, qos, queue):
        v = raw.strip().lower() if raw else ""
        if not v:
            continue
        for c in classes:
            if v in c.labels or v == c.name.lower():
                return c
        if priority is None and raw is label:
            try:
                priority = float(v)
            except ValueError:
                pass
    if priority is not None and math.isfinite(priority):
        ranked = sorted((c for c in classes if c.min_priority is not None), key=lambda c: -(c.min_priority or 0))
        for c in ranked:
            if priority >= (c.min_priority or 0):
                return c
    return class_named(classes, DEFAULT_CLASS)


def wait_target_s(runtime_s: float, time_limit_s: float, cls: JobClass, ratio: float) -> float:
    """How long a job may wait before the wait rule sends it out:
    ``min(ratio x runtime, class max_wait_s)``; the time limit stands in for a missing runtime,
    the class target for both (inf: never by the wait rule)."""
    run = runtime_s if runtime_s > 0 else time_limit_s
    if run > 0:
        return min(ratio * run, cls.max_wait_s)
    return cls.max_wait_s


def fmt_wait(s: float) -> str:
    if math.isinf(s):
        return "none"
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"
