"""Deadline-aware spot/on-demand mixing for interruptible jobs: Uniform Progress.

After Wu et al., "Can't Be Late: Optimizing Spot Instance Savings under Deadlines" (NSDI'24).
A job of ``job_h`` hours of work must finish by ``deadline_h`` (hours since it was handed to the
cloud). The straight line from (0, 0) to (deadline, job) is the progress it must keep on average:

- on or above the line, take spot whenever spot is available; when it is not, wait (no cost);
- below the line, run on on-demand until the job is back on the line — and, once on on-demand,
  stay there until the job is ahead of the line by one restart, so that a switch back to spot
  pays for the restart it costs (the paper's hysteresis);
- safety net: when the remaining slack (time left minus work left) is under one restart plus a
  margin, go on-demand and stay there: one more preemption would miss the deadline.

Pure: hours in, a market (or ``None`` = pause, hold no capacity) out. Time is a parameter.

:func:`outlook` answers the question before that one — should this job start on spot at all? —
from the empirical distribution of spot lifetimes: the expected wall time (and so cost) of
running the job on spot to the end, and how sure its finish time is. :func:`overhead_h` is the
one spot cost rule the quote and the simulator share. numpy runs the per-state sums over the
observations (hundreds of them) in one pass each.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable

from providers.base import Market

# Extra slack, as a share of the job, kept on top of one restart before the safety net fires.
DEFAULT_MARGIN_SHARE = 0.02


def slack_h(progress_h: float, elapsed_h: float, job_h: float, deadline_h: float) -> float:
    """Time left to the deadline minus work left: how much more time the job may lose."""
    return (deadline_h - elapsed_h) - (job_h - progress_h)


def decide(
    progress_h: float,
    elapsed_h: float,
    job_h: float,
    deadline_h: float,
    spot_available: bool,
    on_spot: bool,
    restart_overhead_h: float,
    *,
    on_demand: bool = False,
    margin_h: float | None = None,
) -> Market | None:
    """The market to run on now, or ``None`` to pause (ahead of the line and no spot to be had).

    ``on_spot`` / ``on_demand`` say what the job runs on right now (neither = paused or not yet
    launched); switching costs ``restart_overhead_h`` (start-up plus work since the last
    checkpoint). ``margin_h`` defaults to 2 % of the job.
    """
    if job_h <= 0 or deadline_h <= 0:
        raise ValueError("job_h and deadline_h must be positive")
    if progress_h >= job_h:
        return None  # done: hold nothing
    margin = DEFAULT_MARGIN_SHARE * job_h if margin_h is None else margin_h
    slack = slack_h(progress_h, elapsed_h, job_h, deadline_h)
    # Safety net. A job already on spot loses a restart only when preempted, so it may stay
    # while the slack still covers that restart; a job off spot needs the restart to get there.
    if slack < restart_overhead_h + margin:
        return Market.ON_DEMAND
    line = job_h * min(1.0, max(0.0, elapsed_h) / deadline_h)
    if on_demand:
        # Hysteresis: leave on-demand only when ahead by a restart, and only for live spot.
        if spot_available and progress_h >= line + restart_overhead_h:
            return Market.SPOT
        return Market.ON_DEMAND
    if progress_h >= line:
        if on_spot or spot_available:
            return Market.SPOT
        return None
    # Behind the line.
    if on_spot:
        return Market.SPOT if progress_h + restart_overhead_h >= line and spot_available else Market.ON_DEMAND
    return Market.ON_DEMAND


def pause_budget_h(progress_h: float, elapsed_h: float, job_h: float, deadline_h: float) -> float:
    """How long a paused job may stay paused before it falls below the progress line."""
    if job_h <= 0:
        return 0.0
    # progress_h = job_h * t / deadline_h  =>  t = progress_h * deadline_h / job_h
    return max(0.0, progress_h * deadline_h / job_h - elapsed_h)


# ---------------------------------------------------------------------------------------------
# What spot costs and how long it takes, from the lifetime distribution.


@dataclass(frozen=True, slots=True)
class LifetimeDist:
    """Empirical spot node lifetimes, hours, sorted (a censored observation — the node outlived
    the log — counts as its observed life plus one mean lifetime: it lived at least that long)."""

    hours: tuple[float, ...]

    @classmethod
    def from_observations(cls, obs: Iterable[tuple[float, bool]]) -> "LifetimeDist":
        """``obs``: (lifetime seconds, censored) pairs."""
        obs = list(obs)
        if not obs:
            raise ValueError("a lifetime distribution needs at least one observation")
        mean = sum(s for s, _ in obs) / len(obs)
        return cls(tuple(sorted((s + (mean if c else 0.0)) / 3600.0 for s, c in obs)))

    @property
    def median_h(self) -> float:
        h = self.hours
        return h[len(h) // 2]


@dataclass(frozen=True, slots=True)
class SpotOutlook:
    """Running ``work_h`` hours of work on spot until it finishes: the expected wall time (every
    attempt's start-up, progress lost since the last checkpoint, preemptions) and its spread.
    Billing is per node-hour held, so the expected cost is ``mean_h`` x the gang's hourly price."""

    mean_h: float
    std_h: float

    def finish_by_h(self, confidence: float) -> float:
        """A finish time met with at least ``confidence`` whatever the distribution's shape
        (Cantelli's one-sided bound)."""
        if self.mean_h == math.inf:
            return math.inf
        return self.mean_h + self.std_h * math.sqrt(confidence / (1.0 - confidence))


def outlook(dist: LifetimeDist, work_h: float, checkpoint_h: float, startup_h: float, nodes: int = 1) -> SpotOutlook:
    """The expected wall time on spot and its standard deviation, exactly over ``dist``.

    A gang of ``nodes`` lives as long as its first node (survival S(t)^nodes). Each attempt
    starts up for ``startup_h``; it finishes when it lives ``startup_h`` + the work left, else it
    keeps the whole checkpoints it completed (none without checkpoints) and starts again. The
    state is the number of checkpoints done; one backward pass over the states (numpy over the
    observations) solves the renewal equations for the first two moments.
    """
    if work_h <= 0:
        return SpotOutlook(0.0, 0.0)
    if checkpoint_h < 0 or startup_h < 0 or nodes < 1:
        raise ValueError("checkpoint_h and startup_h must be >= 0 and nodes >= 1")
    return _outlook(dist, round(work_h, 6), round(checkpoint_h, 6), round(startup_h, 6), nodes)


@lru_cache(maxsize=4096)
def _outlook(dist: LifetimeDist, work_h: float, ckpt_h: float, startup_h: float, nodes: int) -> SpotOutlook:
    import numpy as np  # here, not at the top: the CLI's start-up imports this module

    life = np.asarray(dist.hours)
    n = len(life)
    surv = 1.0 - np.arange(n + 1) / n  # survival just before each sorted sample, and after the last
    wt = surv[:-1] ** nodes - surv[1:] ** nodes  # P(gang lifetime = that sample)
    cw = np.concatenate(([0.0], np.cumsum(wt)))  # prefix sums over the sorted samples
    cwl = np.concatenate(([0.0], np.cumsum(wt * life)))
    cwl2 = np.concatenate(([0.0], np.cumsum(wt * life * life)))
    total = float(cw[-1])
    step = ckpt_h if ckpt_h > 0 else work_h
    k_max = max(1, math.ceil(work_h / step - 1e-9))
    gain = np.floor(np.maximum(0.0, life - startup_h) / step).astype(np.int64) if ckpt_h > 0 else np.zeros(n, np.int64)
    # Samples are sorted, so "no checkpoint reached" is a prefix [0, z) and "finishes" a suffix [f, n).
    z = int(np.searchsorted(life, startup_h + step)) if ckpt_h > 0 else n
    t1 = np.zeros(k_max + 1)  # expected time to finish from k checkpoints done
    t2 = np.zeros(k_max + 1)  # its second moment
    # What each state needs but the states after it, for every state at once.
    ks = np.arange(k_max)
    x_fin = startup_h + work_h - ks * step
    f_all = np.searchsorted(life, x_fin)
    p_fin = total - cw[f_all]
    st_all = np.minimum(z, f_all)
    p_stay = cw[st_all]
    if bool((p_stay >= total - 1e-12).any()):
        return SpotOutlook(math.inf, math.inf)
    e1_all = cwl[f_all] + x_fin * p_fin
    e2_all = cwl2[f_all] + x_fin * x_fin * p_fin
    left = 1.0 - p_stay
    cwl_st = cwl[st_all]
    # Samples that reach a checkpoint but do not finish: [z, f) for state k.
    wz, xz, gz = wt[z:], life[z:], gain[z:]
    for k in range(k_max - 1, -1, -1):
        e1, e2 = float(e1_all[k]), float(e2_all[k])
        m = int(f_all[k]) - z
        if m > 0:
            nxt = gz[:m] + k
            np.minimum(nxt, k_max, out=nxt)
            tn = t1[nxt]
            e1 += float(wz[:m] @ tn)
            e2 += float(wz[:m] @ (2.0 * xz[:m] * tn + t2[nxt]))
        den = float(left[k])
        t1[k] = a = e1 / den
        t2[k] = (e2 + 2.0 * float(cwl_st[k]) * a) / den
    return SpotOutlook(float(t1[0]), math.sqrt(max(0.0, float(t2[0]) - float(t1[0]) ** 2)))


def overhead_h(
    run_h: float,
    nodes: int,
    checkpoint_h: float,
    startup_h: float,
    rate_per_node_h: float,
    dist: LifetimeDist | None = None,
) -> float:
    """Expected wall hours a spot run loses to interruptions beyond its start-up and ``run_h``:
    from the lifetime distribution when there is one, else from the per-node interruption rate
    (expected interruptions x (half a checkpoint interval + a restart)). The quote's spot cost
    line and the simulator both price spot with this."""
    if dist is None:
        return rate_per_node_h * nodes * run_h * (checkpoint_h / 2.0 + startup_h)
    return max(0.0, outlook(dist, run_h, checkpoint_h, startup_h, nodes).mean_h - startup_h - run_h)
