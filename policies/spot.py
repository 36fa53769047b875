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
"""
from __future__ import annotations

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
