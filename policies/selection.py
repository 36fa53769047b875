"""Which pending jobs go to the cloud first, and which never should.

Bursting helps a job only when the cloud's start-up costs it less than the on-prem queue would,
and it pays best for jobs that lose little when the cloud is slower or spot is taken away. So:

- never burst a job whose predicted on-prem wait is short relative to its runtime (it will be
  served soon enough at home), nor one so short that start-up would be most of its cloud bill;
- among the rest, send first the interruptible ones (they can take spot), then tuning, eval and
  inference before training, then the short before the long (more jobs relieved per GPU-hour,
  less exposure), then the data-light before the data-heavy (less transfer, faster start).

Pure: plain values in, plain values out.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

from policies.classes import JobClass
from policies.queue import PendingJob

# Lower ranks go first.
KIND_RANK = {"inference": 0, "eval": 1, "tuning": 2, "training": 3}


@dataclass(frozen=True, slots=True)
class SelectionConfig:
    """Thresholds for :func:`eligibility`; the defaults are the broker policy's.

    - ``min_wait_share`` (0.05): never burst a job predicted to wait less than this share of its
      runtime at on-demand prices: it will be served soon enough at home, and start-up plus the
      cloud's price would buy it little. The bar scales with the price the job would pay
      (``Candidate.price_ratio``): a job that can take spot at a third of on-demand is worth
      sending at a third of the wait. This is a value-of-time rule: sending is worth it when
      wait x value >= cloud price x runtime. (The wait trigger asks more:
      ``TriggerConfig.wait_runtime_ratio``.)
    - ``startup_s`` (120): the cloud's start-up delay, for candidates that do not carry their
      own (``Candidate.startup_s``, from the catalog terms of the offer they would take).
    - ``min_runtime_startups`` (1): never burst a job that runs for less than one start-up:
      start-up would be over half of its cloud bill. (Raise it where the queue can wait; on the
      Philly replay a bar of 1 keeps the broker within 1.06x of its execution lower bound.)
      The bar is a price rule, not a wait rule: once such a job has waited, or is predicted to
      wait, past its class's wait target (``JobClass.max_wait_s``), the start-up is cheap next
      to the wait and it may go (a six-minute whole-node job behind week-long services would
      otherwise wait for days).
    - ``max_data_gb`` (0 = no limit): jobs reading more than this stay home.
    """

    min_wait_share: float = 0.05
    startup_s: float = 120.0
    min_runtime_startups: float = 1.0
    max_data_gb: float = 0.0


@dataclass(frozen=True, slots=True)
class Candidate:
    """A pending job with the broker's estimate of how long it would still wait on-prem."""

    job: PendingJob
    predicted_wait_s: float  # total predicted wait from submission, including what it waited
    # The cloud price this job would pay over the on-demand price (spot: ~0.3; unknown: 1).
    price_ratio: float = 1.0
    # Start-up of the offer it would take (None: ``SelectionConfig.startup_s``).
    startup_s: float | None = None
    # Its class (policies.classes; None: not classified yet, the trigger classifies it).
    job_class: JobClass | None = None

    @property
    def wait_s(self) -> float:
        return max(float(self.job.waited_s), self.predicted_wait_s)


def eligibility(c: Candidate, cfg: SelectionConfig = SelectionConfig()) -> str | None:
    """Why ``c`` should not go to the cloud, or None when it may."""
    j = c.job
    runtime = j.runtime_s
    target = c.job_class.max_wait_s if c.job_class is not None else math.inf
    if c.job_class is not None and not c.job_class.burst:
        return f"job {j.job_id} is of class {c.job_class.name}, which never bursts"
    if runtime <= 0:
        if c.wait_s >= target:  # nothing known but its class's wait target, and it is past it
            return None
        return f"job {j.job_id} has no runtime estimate"
    startup = cfg.startup_s if c.startup_s is None else c.startup_s
    if runtime < cfg.min_runtime_startups * startup and c.wait_s < target:
        return (f"job {j.job_id} runs {runtime:.0f} s, under {cfg.min_runtime_startups:g} cloud "
                f"start-up(s) of {startup:.0f} s" + (f", and waits {c.wait_s:.0f} s, under its class's "
                                                     f"{target:.0f} s target" if math.isfinite(target) else ""))
    if cfg.max_data_gb and j.data_gb > cfg.max_data_gb:
        return f"job {j.job_id} reads {j.data_gb:g} GB, over the {cfg.max_data_gb:g} GB limit"
    share = cfg.min_wait_share * min(1.0, max(0.0, c.price_ratio))
    if c.wait_s < min(share * runtime, target):
        return (f"job {j.job_id} is predicted to wait {c.wait_s:.0f} s on-prem, under "
                f"{share:.2g} of its {runtime:.0f} s runtime")
    return None


def rank_key(j: PendingJob) -> tuple[int, int, float, float, float, str]:
    """Sort key: interruptible, then kind, then short (unknown last), then data-light, then oldest."""
    return (
        0 if j.interruptible else 1,
        KIND_RANK.get(j.kind, 3),
        j.runtime_s or math.inf,  # an unknown runtime is not a short one
        j.data_gb,
        -j.waited_s,
        j.job_id,
    )


def rank(jobs: Iterable[PendingJob]) -> list[PendingJob]:
    return sorted(jobs, key=rank_key)


def select(
    candidates: Sequence[Candidate],
    cfg: SelectionConfig = SelectionConfig(),
    *,
    max_gpus: int | None = None,
) -> tuple[list[Candidate], list[tuple[Candidate, str]]]:
    """Split candidates into those to burst (ranked, within ``max_gpus``) and those kept home.

    Every kept-home candidate comes with its reason. A job too big for what is left of
    ``max_gpus`` is skipped, and smaller ones behind it may still go.
    """
    chosen: list[Candidate] = []
    kept: list[tuple[Candidate, str]] = []
    ok: list[Candidate] = []
    for c in candidates:
        why = eligibility(c, cfg)
        if why:
            kept.append((c, why))
        else:
            ok.append(c)
    ok.sort(key=lambda c: rank_key(c.job))
    left = max_gpus
    for c in ok:
        if left is not None and c.job.gpus > left:
            kept.append((c, f"job {c.job.job_id} needs {c.job.gpus} GPUs, only {left} left under the burst limits"))
            continue
        chosen.append(c)
        if left is not None:
            left -= c.job.gpus
    return chosen, kept
