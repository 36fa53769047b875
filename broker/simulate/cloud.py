"""The cloud: each burst job gets its own nodes of the offering the policy picks.

Nodes come up after the provider's ``startup_s`` and are billed from launch to teardown at job
end (at least ``BILLING_MINIMUM_S``). Spot nodes are preempted after a lifetime drawn from real
observed lifetimes (per cloud) or, without them, from the catalog's interruption rate; a
preempted job resumes from its last checkpoint, the rework is billed, and the policy decides
where it goes on.
"""
from __future__ import annotations

import math
from array import array
from dataclasses import dataclass
from typing import Callable, MutableSequence

from policies import spot as spot_rule
from providers.base import Market
from providers.catalog import Catalog

from broker.simulate.chooser import Chooser, Pick
from broker.simulate.model import CLOUD, DONE, E_CLOUD_END, Policy, SimConfig
from broker.simulate.lifetimes import Lifetimes
from broker.simulate.table import JobTable
from broker.simulate.trace import hash_unit

BILLING_MINIMUM_S = 60.0


@dataclass(slots=True)
class Attempt:
    job: int
    pick: Pick
    launched: float
    ready: float
    end: float  # when this attempt ends (finish or preemption)
    finishes: bool
    gpus: int  # GPUs held (nodes x GPUs per node)


class Cloud:
    """Burst jobs, their attempts and what they cost. ``state`` and ``wait`` are the replay's
    per-job lists, shared; ``push(t, kind, payload)`` schedules the replay's events."""

    def __init__(self, jobs: JobTable, catalog: Catalog, policy: Policy, cfg: SimConfig,
                 lifetimes: Lifetimes | None, state: MutableSequence[int], wait: MutableSequence[float],
                 push: Callable[[float, int, object], None]):
        self.jobs = jobs
        self.catalog = catalog
        self.policy = policy
        self.cfg = cfg
        self.lifetimes = lifetimes
        self.state = state
        self.wait = wait
        self.push = push
        self.chooser = Chooser(catalog, policy, cfg, lifetimes, jobs)
        n = len(jobs)
        self.done_work = array("d", bytes(8 * n))  # checkpointed cloud progress (trace seconds)
        self.burst_at = array("d", bytes(8 * n))
        self.interrupts = array("i", bytes(4 * n))
        self.gpus = 0  # GPUs held now
        self.gpus_by_market = {"spot": 0, "on_demand": 0, "reserved": 0}
        self.cost = 0
        self.lower_bound = 0
        self.hindsight = 0
        self.deadline_misses = 0  # burst jobs that finished later than start-up + runtime x (1 + slack)
        self.cost_by_market: dict[str, int] = {}
        self.cost_by_provider: dict[str, int] = {}
        self.gpu_s = 0.0
        self.interruptions = 0
        self.jobs_burst = 0

    def burst(self, i: int, t: float) -> bool:
        """Send job i to the cloud now; False when no offering can hold it."""
        j = self.jobs[i]
        ch = self.chooser.for_job(i)
        if ch.first is None:
            return False
        self.state[i] = CLOUD
        self.jobs_burst += 1
        self.burst_at[i] = t
        self.wait[i] = -1.0
        self.lower_bound += int(ch.lower_bound_rate * j.duration_s) + ch.lower_bound_extra
        self.hindsight += self.in_hindsight(i, ch)
        first = ch.first
        self.cost += first.extra_micros
        self._book(first, first.extra_micros)
        self.launch(i, t, first)
        return True

    def _book(self, p: Pick, micros: int) -> None:
        m = p.offering.market.value
        self.cost_by_market[m] = self.cost_by_market.get(m, 0) + micros
        pr = p.offering.provider
        self.cost_by_provider[pr] = self.cost_by_provider.get(pr, 0) + micros

    def launch(self, i: int, t: float, p: Pick) -> None:
        j = self.jobs[i]
        spot = p.offering.market is Market.SPOT
        work_left = (j.duration_s - self.done_work[i]) * p.stretch
        ready = t + p.startup_s
        end = ready + work_left
        finishes = True
        if spot:
            life = self.lifetime(i, p, self.interrupts[i])
            if t + life < end:
                end = t + life
                finishes = False
        gpus = p.nodes * p.offering.instance.gpus
        self.gpus += gpus
        self.gpus_by_market[p.offering.market.value] += gpus
        self.push(end, E_CLOUD_END, Attempt(i, p, t, ready, end, finishes, gpus))

    def in_hindsight(self, i: int, ch) -> int:
        """What job i costs on the market that is cheapest knowing its interruptions in advance:
        on-demand, or spot with the rework the same sampled lifetimes cause."""
        j = self.jobs[i]
        best = math.inf
        if ch.od_best is not None:
            p = ch.od_best
            best = p.extra_micros + self.billed(p, p.startup_s + j.duration_s * p.stretch)
        if j.interruptible and ch.spot_best is not None:
            best = min(best, self.spot_in_hindsight(i, ch.spot_best))
        if best == math.inf:  # neither: the policy's own first pick, uninterrupted
            p = ch.first
            best = p.extra_micros + self.billed(p, p.startup_s + j.duration_s * p.stretch)
        return int(best)

    def spot_in_hindsight(self, i: int, p: Pick, max_attempts: int = 200) -> float:
        j = self.jobs[i]
        ckpt = 60.0 * (j.checkpoint_minutes or self.cfg.checkpoint_minutes)
        done, cost = 0.0, float(p.extra_micros)
        for k in range(max_attempts):
            need = p.startup_s + (j.duration_s - done) * p.stretch
            life = self.lifetime(i, p, k)
            if life >= need:
                return cost + self.billed(p, need)
            cost += self.billed(p, life)
            if ckpt > 0:
                done = min(j.duration_s, done + (max(0.0, life - p.startup_s) / p.stretch // ckpt) * ckpt)
        return math.inf

    @staticmethod
    def billed(p: Pick, held_s: float) -> int:
        return int(p.offering.hourly_micros * p.nodes * max(held_s, BILLING_MINIMUM_S) / 3600.0)

    def lifetime(self, i: int, p: Pick, attempt: int) -> float:
        """Time to the first preemption of any node of the gang, from launch, on the job's
        ``attempt``-th launch (the same draw for every policy)."""
        j = self.jobs[i]
        key = f"{j.job_id}:{attempt}"
        seed = self.cfg.seed
        provider = p.offering.provider
        best = math.inf
        for k in range(p.nodes):
            u = hash_unit(seed, f"life:{key}:{k}")
            life = None
            if self.lifetimes is not None:
                life = self.lifetimes.draw(provider, u, hash_unit(seed, f"life2:{key}:{k}"))
            if life is None:
                rate = self.catalog.terms[provider].spot_interruptions_per_hour
                life = math.inf if rate <= 0 else -math.log(1.0 - u) * 3600.0 / rate
            best = min(best, life)
        return best

    def end(self, a: Attempt, t: float) -> None:
        """An attempt ended: bill it; the job is done, or it was preempted and goes on."""
        i, p = a.job, a.pick
        j = self.jobs[i]
        self.gpus -= a.gpus
        self.gpus_by_market[p.offering.market.value] -= a.gpus
        billed = max(t - a.launched, BILLING_MINIMUM_S)
        micros = int(p.offering.hourly_micros * p.nodes * billed / 3600.0)
        self.cost += micros
        self._book(p, micros)
        self.gpu_s += a.gpus * billed
        if self.wait[i] < 0 and t >= a.ready:
            self.wait[i] = a.ready - j.submit_s
        if p.offering.market is Market.SPOT:
            self.chooser.observe(p.offering.provider, p.nodes * (t - a.launched) / 3600.0,
                                 0 if a.finishes else p.nodes)
        if a.finishes:
            self.state[i] = DONE
            deadline = p.startup_s + j.duration_s * p.stretch * (1.0 + self.policy.deadline_slack)
            self.deadline_misses += t - self.burst_at[i] > deadline + 1e-6
            return
        # Preempted: keep the checkpointed progress, decide where to go on.
        self.interruptions += 1
        self.interrupts[i] += 1
        ckpt = 60.0 * (j.checkpoint_minutes or self.cfg.checkpoint_minutes)
        ran = max(0.0, t - a.ready) / p.stretch
        if ckpt > 0:
            self.done_work[i] = min(j.duration_s, self.done_work[i] + (ran // ckpt) * ckpt)
        self.launch(i, t, self._next(i, t, p, ckpt))

    def _next(self, i: int, t: float, p: Pick, ckpt: float) -> Pick:
        """Where a preempted job goes on, by the policy."""
        j = self.jobs[i]
        ch = self.chooser.for_job(i)
        fb = ch.fallback
        pol = self.policy
        if pol.market == "spot-greedy":
            return p if self.interrupts[i] < pol.max_spot_attempts or fb is None else fb
        if pol.market == "full-cost":
            spot_pick = ch.spot_best or p
            job_h = (j.duration_s * p.stretch) / 3600.0
            deadline_h = (p.startup_s + j.duration_s * p.stretch * (1.0 + pol.deadline_slack)) / 3600.0
            elapsed_h = (t - self.burst_at[i]) / 3600.0
            if self.chooser.lives is not None and fb is not None:
                return spot_pick if self._spot_again(i, spot_pick, fb, deadline_h - elapsed_h, ckpt) else fb
            restart_h = (p.startup_s + ckpt) / 3600.0
            m = spot_rule.decide(self.done_work[i] * p.stretch / 3600.0, elapsed_h, job_h, deadline_h, True, False,
                                 restart_h)
            return spot_pick if m is Market.SPOT or fb is None else fb
        return fb or p

    def _spot_again(self, i: int, sp: Pick, od: Pick, time_left_h: float, ckpt_s: float) -> bool:
        """After a preemption, with the lifetime distribution: back to spot when finishing the
        rest there is expected to cost less than on-demand and meets the deadline with the
        policy's confidence."""
        dist = self.chooser.lives.get(sp.offering.provider)
        if dist is None:
            return True
        left_s = self.jobs[i].duration_s - self.done_work[i]
        od_cost = (od.startup_s / 3600.0 + left_s * od.stretch / 3600.0) * od.offering.hourly_micros * od.nodes
        # Spot takes at least its start-up and the work left, uninterrupted: when even that is
        # too late or too dear, the outlook (the costly part) cannot say otherwise.
        spot_h = (sp.startup_s + left_s * sp.stretch) / 3600.0
        if spot_h > time_left_h or spot_h * sp.offering.hourly_micros * sp.nodes >= od_cost:
            return False
        o = spot_rule.outlook(dist, left_s * sp.stretch / 3600.0, ckpt_s / 3600.0, sp.startup_s / 3600.0, sp.nodes)
        if o.finish_by_h(self.policy.spot_confidence) > time_left_h:
            return False
        return o.mean_h * sp.offering.hourly_micros * sp.nodes < od_cost
