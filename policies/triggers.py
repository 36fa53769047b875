"""When to burst, when to hold, when to scale in: hysteresis, cooldown and limits.

Two triggers, one function (:func:`evaluate`), called by the live autoscaler with a
:class:`~policies.queue.QueueSnapshot` (through :func:`signals_from_snapshot` and
:func:`candidates_from_snapshot`) and by the simulator with its own state. Both get the same
decisions for the same inputs:

- **threshold**: more than ``pending_gpus_threshold`` GPUs pending, held for
  ``stabilization_s``, and the diagnosis says the queue is *resource-bound* (more GPUs fix it)
  or *mixed* (then only the jobs more capacity would start count; ``burst_verdicts``),
  and ``cooldown_s`` since the last threshold burst. It sends enough jobs to bring the pending
  GPUs back to the threshold.
- **wait** ("stop the bleeding"): a job whose wait, or predicted wait, exceeds its target goes
  out: ``min(wait_runtime_ratio x runtime, its class's max_wait_s)`` (:mod:`policies.classes`;
  no runtime: the time limit, else the class target alone). Classes that may not burst stay.

Schedule first, then scale: when the diagnosis is *scheduling-bound* (GPUs free or wasted while
jobs wait), neither trigger bursts by default, and the decision says "did not burst, because
scheduling-bound: …" with the diagnosis' causes and their fix. Sending the longest waiters out
anyway is an opt-in (``burst_overdue_when_scheduling_bound``): it buys cloud GPUs for a queue
that on-prem GPUs could serve. Under *mixed*, only the jobs more capacity would start count as
pending and may go. Schedule first holds a job only up to its class target, though: a job that
has waited past its class's ``max_wait_s`` goes by the wait rule under any verdict (the scheduling fix is the operator's, and nobody may have applied it; the class's
target is the wait its owner was promised). Its runtime share alone does not release it.

Both are bounded by ``max_gpus_in_flight`` (cloud GPUs launching or running) and by a token
bucket of ``max_burst_gpus_per_hour``. Cloud nodes idle for ``scale_in_idle_s`` are torn down.

Pure: time is the ``now`` argument, the state is an immutable value returned anew.
"""
from __future__ import annotations

import enum

from collections import Counter
from dataclasses import dataclass, field, replace
from operator import attrgetter
from typing import Callable, Collection, Mapping, Sequence

from policies.causes import Verdict, reason_head
from policies.classes import DEFAULT_CLASSES, JobClass, classify, fmt_wait, wait_target_s
from policies.queue import NON_CAPACITY_REASONS, PendingJob, QueueSnapshot
from policies.selection import Candidate, SelectionConfig, eligibility, rank_key
from policies.waits import fluid_wait_s, snapshot_waits  # noqa: F401 (fluid_wait_s: re-exported)

_HELD = frozenset(NON_CAPACITY_REASONS)  # one hash lookup per job, not a scan of the tuple


def held_reason(reason: str) -> bool:
    """Whether a job pending for ``reason`` waits on something capacity cannot fix. Slurm adds
    detail after a comma (``ReqNodeNotAvail, UnavailableNodes:gpu-[1-2]``): the reason is the
    part before it, as the diagnosis reads it (:func:`policies.causes.reason_head`)."""
    return reason in _HELD or ("," in reason and reason_head(reason) in _HELD)


class DecisionAction(enum.StrEnum):
    """What a decision did: the action the trigger rules choose (burst, hold, scale_in) and what
    the autoscaler records of acting on it. The values are what the store and the JSON hold."""

    BURST = "burst"
    HOLD = "hold"
    SCALE_IN = "scale_in"
    BURST_FAILED = "burst_failed"
    OFFLOAD = "offload"
    OFFLOAD_FAILED = "offload_failed"


BURST, HOLD, SCALE_IN = DecisionAction.BURST, DecisionAction.HOLD, DecisionAction.SCALE_IN


@dataclass(frozen=True, slots=True)
class TriggerConfig:
    """Burst trigger settings. Every default is documented with why.

    - ``pending_gpus_threshold`` (8): one node's worth of GPUs pending is normal churn; more is a
      queue.
    - ``stabilization_s`` (300): the threshold must hold this long, so a burst of submissions
      that the cluster absorbs in minutes does not buy cloud capacity that boots too late.
    - ``cooldown_s`` (120): between threshold bursts, so the effect of the last one (start-up is
      minutes) is seen before the next.
    - ``max_gpus_in_flight`` (512): cloud GPUs launching or running, a budget guard.
    - ``max_burst_gpus_per_hour`` (512): token bucket on GPUs launched, refilled continuously;
      also the bucket's depth.
    - ``scale_in_idle_s`` (300): a cloud node idle this long is torn down; shorter than a
      start-up is wasteful churn, much longer pays for idle GPUs.
    - ``wait_runtime_ratio`` (0.5): the wait trigger's ratio (see module doc).
    - ``burst_overdue_when_scheduling_bound`` (false): schedule first — under a scheduling-bound
      verdict the wait trigger holds a job until it has waited past its class target (not its
      runtime share). true: it sends every overdue job (the longest waiters) out at its wait
      target, paying cloud prices for waits the on-prem GPUs could have served.
    - ``threshold_trigger`` / ``wait_trigger``: turn either trigger off.
    - ``burst_verdicts`` (resource-bound, mixed): diagnoses under which the threshold trigger
      may fire. Under mixed only the jobs more capacity would start count and go (see
      :func:`evaluate`). Without mixed the threshold never fires on a mixed queue: on the
      Helios-derived workload (long whole-node jobs beside scattered free GPUs, README
      "Workloads"; seed 0, observed spot lifetimes, load average 35 on 2 CPUs) the p95 wait is
      99 min without it against the price-only burst's 19, and 52 min with it. ``()`` disables the gate (the naive autoscaler).
    - ``order`` ("ranked"): jobs go out by :func:`policies.selection.rank_key`, only those
      :func:`policies.selection.eligibility` allows; "fifo" sends the longest-waiting first
      with no eligibility check (the naive autoscaler).
    - ``selection``: thresholds for eligibility (start-up, minimum runtime, data).
    - ``classes``: the job classes and their wait targets (:data:`policies.classes.DEFAULT_CLASSES`
      with ``[autoscaler.classes.NAME]`` merged in).
    """

    pending_gpus_threshold: int = 8
    stabilization_s: float = 300.0
    cooldown_s: float = 120.0
    max_gpus_in_flight: int = 512
    max_burst_gpus_per_hour: int = 512
    scale_in_idle_s: float = 300.0
    wait_runtime_ratio: float = 0.5
    threshold_trigger: bool = True
    wait_trigger: bool = True
    burst_overdue_when_scheduling_bound: bool = False
    burst_verdicts: tuple[Verdict, ...] = (Verdict.RESOURCE_BOUND, Verdict.MIXED)
    order: str = "ranked"
    selection: SelectionConfig = field(default_factory=SelectionConfig)
    classes: tuple[JobClass, ...] = DEFAULT_CLASSES

    def __post_init__(self) -> None:
        for name in ("stabilization_s", "cooldown_s", "scale_in_idle_s", "wait_runtime_ratio"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be zero or positive, got {getattr(self, name)}")
        if self.pending_gpus_threshold < 0:
            raise ValueError(f"pending_gpus_threshold must be zero or positive, got {self.pending_gpus_threshold}")
        if self.max_gpus_in_flight < 0 or self.max_burst_gpus_per_hour <= 0:
            raise ValueError("max_gpus_in_flight must be >= 0 and max_burst_gpus_per_hour > 0")
        if self.order not in ("ranked", "fifo"):
            raise ValueError(f"order must be 'ranked' or 'fifo', got {self.order!r}")
        object.__setattr__(self, "burst_verdicts",
                           tuple(Verdict.parse(v) for v in self.burst_verdicts))


@dataclass(frozen=True, slots=True)
class TriggerState:
    """What the trigger remembers between evaluations. Start from ``TriggerState()``."""

    above_since: float | None = None  # pending GPUs over the threshold since
    last_burst_at: float | None = None  # last threshold burst
    tokens: float | None = None  # burst-rate bucket (None = full)
    tokens_at: float = 0.0


@dataclass(frozen=True, slots=True)
class Signals:
    """The queue as the trigger sees it."""

    pending_gpus: int
    gpus_total: int
    gpus_allocated: int
    cloud_gpus_in_flight: int = 0
    # Cloud nodes with nothing to run: (node name, idle since).
    idle_cloud_nodes: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True, slots=True)
class Decision:
    action: DecisionAction  # BURST, HOLD or SCALE_IN
    jobs: tuple[Candidate, ...] = ()
    scale_in: tuple[str, ...] = ()  # cloud nodes to tear down (may come with a burst)
    reason: str = ""
    trigger: str = ""  # "threshold", "wait", "threshold+wait" or ""
    wake_at: float | None = None  # evaluate again by then even if nothing happens
    n_wait: int = 0  # the first n_wait of ``jobs`` go for the wait rule, the rest for the threshold

    @property
    def gpus(self) -> int:
        return sum(c.job.gpus for c in self.jobs)

    @property
    def job_ids(self) -> tuple[str, ...]:
        return tuple(c.job.job_id for c in self.jobs)


def allocation_verdict(s: Signals, busy_share: float = 0.9) -> Verdict:
    """A diagnosis from allocation alone, for when no full :mod:`policies.diagnose` is at hand.

    healthy: nothing pending; resource-bound: GPUs pending and at least ``busy_share`` of the
    on-prem GPUs allocated; scheduling-bound: as many GPUs free as pending, yet they wait
    (whole-node requests on a fragmented cluster, limits); mixed: in between.
    """
    if s.pending_gpus <= 0:
        return Verdict.HEALTHY
    if s.gpus_total <= 0 or s.gpus_allocated >= busy_share * s.gpus_total:
        return Verdict.RESOURCE_BOUND
    if s.gpus_total - s.gpus_allocated >= s.pending_gpus:
        return Verdict.SCHEDULING_BOUND
    return Verdict.MIXED


def _refill(cfg: TriggerConfig, state: TriggerState, now: float) -> float:
    cap = float(cfg.max_burst_gpus_per_hour)
    if state.tokens is None:
        return cap
    return min(cap, state.tokens + (now - state.tokens_at) * cap / 3600.0)


def _soonest(*ts: float | None) -> float | None:
    vals = [t for t in ts if t is not None]
    return min(vals) if vals else None


class _Pass:
    """One evaluation: the jobs chosen so far, the GPUs left to spend, why nothing went."""

    def __init__(self, cfg: TriggerConfig, state: TriggerState, now: float, signals: Signals,
                 candidates: Sequence[Candidate], allowed: list[Candidate]) -> None:
        self.cfg, self.state, self.now, self.signals = cfg, state, now, signals
        self.candidates, self.allowed = candidates, allowed
        self.tokens = _refill(cfg, state, now)
        self.room = max(0, cfg.max_gpus_in_flight - signals.cloud_gpus_in_flight)
        self.left = min(self.room, int(self.tokens))
        self.chosen: list[Candidate] = []
        self.taken: set[str] = set()
        self.why_not: list[str] = []
        self.wake: list[float | None] = []
        self.fired: list[str] = []
        self.threshold_pool = allowed  # what the threshold trigger may send (under mixed: capacity's)
        self.released: list[Candidate] = []  # overdue jobs schedule first let go at their class target

    def take(self, c: Candidate) -> bool:
        if c.job.job_id in self.taken or c.job.gpus > self.left:
            return False
        self.chosen.append(c)
        self.taken.add(c.job.job_id)
        self.left -= c.job.gpus
        return True

    def refill_wake(self) -> None:
        """Nothing went for the burst-rate limit: wake when the bucket holds the smallest job."""
        cfg = self.cfg
        if not self.chosen and self.tokens < cfg.max_burst_gpus_per_hour and any(
                "burst-rate" in w for w in self.why_not):
            need = min((c.job.gpus for c in self.allowed), default=1)
            self.wake.append(self.now + max(0.0, need - self.tokens) * 3600.0 / cfg.max_burst_gpus_per_hour)

    def limit_reason(self, pool: Sequence[Candidate]) -> str:
        return _limit_reason(self.cfg, self.signals, self.tokens, self.room,
                             min(c.job.gpus for c in pool))

    def overdue(self) -> list[Candidate]:
        """The eligible jobs whose wait exceeds their wait target (:func:`target_s`)."""
        cfg = self.cfg
        overdue = [c for c in self.allowed if c.wait_s > target_s(cfg, c)]
        if cfg.order == "fifo":
            overdue = [c for c in overdue if c.job.runtime_s > 0]
        return overdue

    def wait_trigger(self, *, gated: bool) -> None:
        """Every overdue, eligible job; ``gated`` (schedule first holds the queue): only those
        past their class target (:func:`past_class_target`)."""
        overdue = self.overdue()
        if gated:
            overdue = [c for c in overdue if past_class_target(self.cfg, c)]
        n_before = len(self.chosen)
        for c in overdue:
            self.take(c)
        if len(self.chosen) > n_before:
            self.fired.append("wait")
        elif overdue:
            self.why_not.append(self.limit_reason(overdue))

    def threshold_trigger(self, pending_gpus: int, above_since: float | None,
                          verdict: Verdict) -> bool:
        """Enough jobs to bring the pending GPUs back to the threshold; True when it fired."""
        cfg, now, state = self.cfg, self.now, self.state
        if above_since is None:
            self.why_not.append(f"{pending_gpus} GPUs pending is not over the threshold of "
                                f"{cfg.pending_gpus_threshold}")
        elif cfg.burst_verdicts and verdict not in cfg.burst_verdicts:
            self.why_not.append(f"the queue is {verdict}, and more GPUs do not fix that")
        elif now - above_since < cfg.stabilization_s:
            self.why_not.append(f"{pending_gpus} GPUs have been pending over the threshold for "
                                f"{now - above_since:.0f} s of the {cfg.stabilization_s:.0f} s window")
            self.wake.append(above_since + cfg.stabilization_s)
        elif state.last_burst_at is not None and now - state.last_burst_at < cfg.cooldown_s:
            self.why_not.append(f"the last burst was {now - state.last_burst_at:.0f} s ago "
                                f"(cooldown {cfg.cooldown_s:.0f} s)")
            self.wake.append(state.last_burst_at + cfg.cooldown_s)
        else:
            gone = {c.job.job_id for c in self.released}  # not among the pending GPUs that count
            excess = pending_gpus - cfg.pending_gpus_threshold - sum(c.job.gpus for c in self.chosen
                                                                     if c.job.job_id not in gone)
            n_before = len(self.chosen)
            for c in self.threshold_pool:
                if excess <= 0:
                    break
                if self.take(c):
                    excess -= c.job.gpus
            if len(self.chosen) > n_before:
                self.fired.append("threshold")
                return True
            if excess > 0:
                if not self.threshold_pool:
                    self.why_not.append("no pending job is worth sending: each would wait only "
                                        "briefly on-prem or run too short for a cloud start-up"
                                        if self.candidates else "no pending job was offered")
                else:
                    self.why_not.append(self.limit_reason(self.threshold_pool))
        return False


def _class(cfg: TriggerConfig, c: Candidate) -> JobClass:
    return c.job_class or classify(cfg.classes, c.job.job_class, c.job.qos, c.job.queue, c.job.priority or None)


def target_s(cfg: TriggerConfig, c: Candidate) -> float:
    """The wait after which the wait rule sends ``c`` out (see :mod:`policies.classes`)."""
    return wait_target_s(c.job.est_runtime_s, c.job.time_limit_s, _class(cfg, c), cfg.wait_runtime_ratio)


def past_class_target(cfg: TriggerConfig, c: Candidate) -> bool:
    """Whether ``c`` has waited past its class's ``max_wait_s``: the longest schedule first may
    hold it (a runtime share under that target does not count). The wait suffered, not the
    predicted one: the predictor counts GPUs, and on a queue that waits on scheduling it is
    wrong both ways (a whole-node job beside scattered free GPUs "starts now"; with no end times
    reported, the queue-ahead estimate ignores the free GPUs)."""
    return c.job.waited_s > _class(cfg, c).max_wait_s


def _class_of(classes: Sequence[JobClass]) -> Callable[[PendingJob], JobClass]:
    """:func:`policies.classes.classify` of a job, once per distinct set of labels (a queue of
    100,000 jobs has a few dozen)."""
    memo: dict[tuple[str, str, str, int], JobClass] = {}

    def of(j: PendingJob) -> JobClass:
        key = (j.job_class, j.qos, j.queue, j.priority)
        cls = memo.get(key)
        if cls is None:
            cls = memo[key] = classify(classes, j.job_class, j.qos, j.queue, j.priority or None)
        return cls
    return of


def _of_class(j: PendingJob, predicted_wait_s: float, cls: JobClass, price_ratio: float = 1.0,
              startup_s: float | None = None) -> Candidate:
    """A candidate of class ``cls`` (a class with ``spot = false`` takes no spot)."""
    if cls.spot is False and j.interruptible:
        j = replace(j, interruptible=False)
    return Candidate(j, predicted_wait_s, price_ratio, startup_s, cls)


def classed(cfg: TriggerConfig, candidates: Sequence[Candidate]) -> list[Candidate]:
    """The candidates with their class set (a class with ``spot = false`` takes no spot)."""
    of = _class_of(cfg.classes)
    return [c if c.job_class is not None else _of_class(c.job, c.predicted_wait_s, of(c.job), c.price_ratio,
                                                         c.startup_s) for c in candidates]


def _allowed(cfg: TriggerConfig, candidates: Sequence[Candidate]) -> list[Candidate]:
    """The candidates that may go at all, in the order they go."""
    if cfg.order == "fifo":
        return list(candidates)
    allowed = [c for c in candidates if eligibility(c, cfg.selection) is None]
    allowed.sort(key=lambda c: (-(c.job_class.priority if c.job_class else 0), rank_key(c.job)))
    return allowed


def evaluate(
    cfg: TriggerConfig,
    state: TriggerState,
    now: float,
    signals: Signals,
    candidates: Sequence[Candidate],
    verdict: Verdict | str = Verdict.RESOURCE_BOUND,
    *,
    capacity_jobs: Collection[str] | None = None,
    scheduling_causes: str = "",
) -> tuple[Decision, TriggerState]:
    """Decide what to do now. ``candidates`` are the pending jobs the caller may burst, each
    with a predicted wait; order them oldest first (the "fifo" order relies on it).

    ``verdict`` is the diagnosis of the queue. Schedule first: under ``scheduling-bound``
    neither trigger bursts (unless ``burst_overdue_when_scheduling_bound`` or ``burst_verdicts``
    opt in) and the decision says why with ``scheduling_causes`` (the diagnosis' causes and
    their fix). Under ``mixed``, only the jobs in ``capacity_jobs`` (those more capacity would
    start; None: not known, every job) count as pending (the signals' less the GPUs of the
    other candidates: pass every job that waits on scheduling) and may go. Schedule first holds
    a job only up to its class target (:func:`past_class_target`), then it goes by the wait
    rule whatever the verdict, and the decision names the class and its target.
    """
    verdict = Verdict.parse(verdict)
    pending_gpus = signals.pending_gpus
    candidates = classed(cfg, candidates) if cfg.order != "fifo" else candidates
    past: list[Candidate] = []  # under mixed, jobs waiting on scheduling past their class target
    if verdict == Verdict.MIXED and capacity_jobs is not None:
        candidates, past, pending_gpus = _capacity_split(cfg, candidates, capacity_jobs, pending_gpus)
    above = pending_gpus > cfg.pending_gpus_threshold
    above_since = (state.above_since if state.above_since is not None else now) if above else None

    allowed = _allowed(cfg, [*candidates, *past])
    p = _Pass(cfg, state, now, signals, candidates, allowed)
    if past:  # they go by the wait rule alone: the threshold counts and sends capacity's jobs
        p.threshold_pool = _allowed(cfg, candidates)

    # Scale-in: idle cloud nodes past the window.
    scale_in = tuple(n for n, since in signals.idle_cloud_nodes if now - since >= cfg.scale_in_idle_s)
    p.wake.append(_soonest(*(since + cfg.scale_in_idle_s for n, since in signals.idle_cloud_nodes
                             if now - since < cfg.scale_in_idle_s)))

    held = verdict == Verdict.SCHEDULING_BOUND
    if held:
        p.why_not.append("scheduling-bound: " + (scheduling_causes.rstrip(". ") or
                                                 "GPUs are free or wasted while jobs wait"))
    if cfg.wait_trigger:
        _wait_rule(p, held)
    n_wait = len(p.chosen)
    threshold_fired = False
    # under a gated scheduling-bound verdict the reason is said above, with the causes
    if cfg.threshold_trigger and not (held and cfg.burst_verdicts
                                      and Verdict.SCHEDULING_BOUND not in cfg.burst_verdicts):
        threshold_fired = p.threshold_trigger(pending_gpus, above_since, verdict)

    p.refill_wake()

    spent = sum(c.job.gpus for c in p.chosen)
    new_state = TriggerState(
        above_since=above_since,
        last_burst_at=now if threshold_fired else state.last_burst_at,
        tokens=p.tokens - spent,
        tokens_at=now,
    )
    wake = _soonest(*p.wake)
    if p.chosen:
        reason = (f"burst {len(p.chosen)} job(s), {spent} GPUs, because "
                  + " and ".join(_fired_reason(t, cfg, pending_gpus, verdict, p.chosen[:n_wait])
                                 for t in p.fired))
        if p.released:
            reason += (f"; the queue is {verdict}, but schedule first holds a job only up to its class "
                       f"target, and {_plural(len(p.released), 'job')} passed it")
        return Decision(BURST, tuple(p.chosen), scale_in, reason, "+".join(p.fired), wake,
                        n_wait), new_state
    reason = "did not burst, because " + ("; ".join(dict.fromkeys(p.why_not)) if p.why_not
                                          else "nothing asked for it")
    if scale_in:
        reason = f"scale in {len(scale_in)} idle cloud node(s); " + reason
        return Decision(SCALE_IN, (), scale_in, reason, "", wake), new_state
    return Decision(HOLD, (), (), reason, "", wake), new_state


def _capacity_split(cfg: TriggerConfig, candidates: Sequence[Candidate], capacity_jobs: Collection[str],
                    pending_gpus: int) -> tuple[list[Candidate], list[Candidate], int]:
    """Under mixed: the jobs more capacity would start, the others past their class target (the
    wait rule may still send those), and the pending GPUs that count: ``pending_gpus`` less the
    GPUs of the candidates that wait on scheduling (with every pending job a candidate, as the
    service passes them: capacity's own)."""
    cap = [c for c in candidates if c.job.job_id in capacity_jobs]
    others = [c for c in candidates if c.job.job_id not in capacity_jobs]
    past = [c for c in others if past_class_target(cfg, c)]
    return cap, past, max(0, pending_gpus - sum(c.job.gpus for c in others))


def _wait_rule(p: _Pass, held: bool) -> None:
    """The wait trigger under the verdict. Schedule first (``held``: a scheduling-bound queue;
    under mixed, the jobs that wait on scheduling are offered only once past their class
    target) holds an overdue job only until it passes its class target
    (:func:`past_class_target`); ``burst_overdue_when_scheduling_bound`` lets every overdue job
    of a scheduling-bound queue go."""
    cfg = p.cfg
    gated = held and not cfg.burst_overdue_when_scheduling_bound
    p.wait_trigger(gated=gated)  # the first rule of a pass: every job chosen so far is its own
    pool = {c.job.job_id for c in p.threshold_pool}
    p.released = [c for c in p.chosen if gated or c.job.job_id not in pool]
    if gated and (kept := [c for c in p.overdue() if not past_class_target(cfg, c)]):
        p.why_not.append(f"{_plural(len(kept), 'job')} ({_plural(sum(c.job.gpus for c in kept), 'GPU')}) "
                         f"{'waits' if len(kept) == 1 else 'wait'} past {_targets(cfg, kept)} but within "
                         f"{'its' if len(kept) == 1 else 'their'} class target, up to which schedule first "
                         "holds a job: burst_overdue_when_scheduling_bound = true would send "
                         f"{'it' if len(kept) == 1 else 'them'} anyway")


def _targets(cfg: TriggerConfig, jobs: Sequence[Candidate]) -> str:
    """``the wait target (class production 30 min; the lesser of the class target and 0.5 x
    runtime)``, with a count per class when several jobs go."""
    by: Counter[tuple[str, float]] = Counter()
    for c in jobs:
        cls = c.job_class or classify(cfg.classes, c.job.job_class, c.job.qos, c.job.queue, c.job.priority or None)
        by[(cls.name, cls.max_wait_s)] += 1
    parts = "; ".join(f"class {n} {fmt_wait(w)}" + (f": {_plural(k, 'job')}" if len(jobs) > 1 else "")
                      for (n, w), k in by.items())
    return (f"the wait target ({parts}; the lesser of the class target and {cfg.wait_runtime_ratio:g} x "
            "runtime)")


def _fired_reason(t: str, cfg: TriggerConfig, pending_gpus: int, verdict: Verdict,
                  waiting: Sequence[Candidate] = ()) -> str:
    if t == "wait":
        return f"the wait exceeds {_targets(cfg, waiting)}"
    return (f"{pending_gpus} GPUs pending stayed over the threshold of {cfg.pending_gpus_threshold} "
            f"for {cfg.stabilization_s:.0f} s on a {verdict} queue")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _limit_reason(cfg: TriggerConfig, s: Signals, tokens: float, room: int, smallest: int) -> str:
    if room < smallest:
        return (f"{s.cloud_gpus_in_flight} cloud GPUs are already in flight "
                f"(limit {cfg.max_gpus_in_flight})")
    return (f"the burst-rate limit is spent ({tokens:.0f} of {cfg.max_burst_gpus_per_hour} "
            f"GPUs/h left, the smallest job needs {smallest})")


# ---------------------------------------------------------------------------------------------
# Adapters for the live service.


def signals_from_snapshot(
    snap: QueueSnapshot,
    cloud_gpus_in_flight: int = 0,
    idle_cloud_nodes: Mapping[str, float] | None = None,
) -> Signals:
    """Signals from a snapshot; pending jobs held for non-capacity reasons do not count."""
    pending = sum(j.gpus for j in snap.pending if not held_reason(j.pending_reason))
    return Signals(
        pending_gpus=pending,
        gpus_total=snap.gpus_total,
        gpus_allocated=snap.gpus_allocated,
        cloud_gpus_in_flight=cloud_gpus_in_flight,
        idle_cloud_nodes=tuple(sorted((idle_cloud_nodes or {}).items())),
    )


def candidates_from_snapshot(
    snap: QueueSnapshot,
    predicted_wait_s: Mapping[str, float] | None = None,
    classes: Sequence[JobClass] | None = None,
) -> list[Candidate]:
    """Pending jobs as candidates, oldest first, with a predicted total wait each.

    Without predictions, :func:`policies.waits.snapshot_waits` over the queue in order (longest
    waiting first): the running jobs' expected ends where the scheduler reports them, else the
    queue-ahead estimate. The simulator predicts with the same function on every tick. With
    ``classes``, each is classified (else the trigger does). Jobs held for non-capacity reasons
    (dependencies, holds, limits) are never candidates: the cloud cannot release them either.
    """
    jobs = [j for j in snap.pending if not held_reason(j.pending_reason)]
    jobs.sort(key=attrgetter("waited_s"), reverse=True)  # stable, as a sort by -waited_s
    remaining = snapshot_waits(snap, jobs) if predicted_wait_s is None or any(
        j.job_id not in predicted_wait_s for j in jobs) else ()
    out: list[Candidate] = []
    of = None if classes is None else _class_of(TriggerConfig(classes=tuple(classes)).classes)
    for k, j in enumerate(jobs):
        if predicted_wait_s is not None and j.job_id in predicted_wait_s:
            pred = predicted_wait_s[j.job_id]
        else:
            pred = j.waited_s + remaining[k]
        out.append(Candidate(j, pred) if of is None else _of_class(j, pred, of(j)))
    return out
