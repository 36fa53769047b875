"""Where a burst job goes: the offering each policy picks from the catalog, cached per job shape."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from policies.cost import Context, Exclusion, PricedOffer, price
from policies.demand import Demand
from policies.spot import LifetimeDist, outlook
from providers.base import MICROS, Market, Offering
from providers.catalog import Catalog

from broker.simulate.lifetimes import Lifetimes
from broker.simulate.model import Policy, SimConfig
from broker.simulate.trace import TraceJob


@dataclass(frozen=True, slots=True)
class Pick:
    offering: Offering
    nodes: int
    stretch: float  # cloud runtime / trace runtime
    extra_micros: int  # storage + transfer for the job
    startup_s: float


@dataclass(frozen=True, slots=True)
class Choice:
    first: Pick | None  # where the job launches
    fallback: Pick | None  # on-demand for a spot job that must switch
    lower_bound_rate: float  # micro-dollars per trace-second, cheapest eligible, no overheads
    lower_bound_extra: int
    od_best: Pick | None = None  # lowest full cost off spot (for the hindsight bound)
    spot_best: Pick | None = None  # lowest full cost on spot


def hours_bucket(h: float) -> int:
    return int(round(4 * math.log2(max(h, 1 / 60))))


class Chooser:
    """Prices a job's shape once per (size, market eligibility, model, data, runtime bucket) and
    remembers the policy's pick; learns spot interruption rates when the policy does."""

    def __init__(self, catalog: Catalog, policy: Policy, cfg: SimConfig, lifetimes: Lifetimes | None = None):
        self.catalog = catalog
        self.policy = policy
        self.cfg = cfg
        self.cache: dict[tuple, Choice] = {}
        self.terms = dict(catalog.terms)
        # The full-cost policy knows the observed lifetime distribution and prices spot by it.
        self.lives = {p: LifetimeDist.from_observations(o) for p, o in lifetimes.by_cloud.items()} \
            if lifetimes is not None and policy.market == "full-cost" else None
        self.ctx = Context(self.terms, catalog.regions, catalog.gpu_perf, 0.0,
                           int(cfg.onprem_egress_usd_per_gb * MICROS), spot_lifetimes=self.lives)
        # Learned spot interruption rates: provider -> [node-hours seen, interruptions seen].
        self.seen: dict[str, list[float]] = {p: [0.0, 0.0] for p in catalog.terms}
        self.rates_in_use = {p: t.spot_interruptions_per_hour for p, t in catalog.terms.items()}

    def observe(self, provider: str, node_hours: float, interrupted: int) -> None:
        if not self.policy.learn_interruptions or self.lives is not None:
            return
        s = self.seen.setdefault(provider, [0.0, 0.0])
        s[0] += node_hours
        s[1] += interrupted
        prior = self.catalog.terms[provider].spot_interruptions_per_hour
        prior_h = 20.0  # the catalog's rate counts as 20 node-hours of observation
        est = (prior * prior_h + s[1]) / (prior_h + s[0])
        cur = self.rates_in_use[provider]
        if abs(est - cur) > 0.15 * max(cur, 1e-3):
            self.rates_in_use[provider] = est
            self.terms[provider] = replace(self.terms[provider], spot_interruptions_per_hour=est)
            self.ctx = replace(self.ctx, terms=self.terms)
            self.cache.clear()

    def choose(self, j: TraceJob) -> Choice:
        hb = hours_bucket(j.duration_s / 3600.0)
        key = (j.gpus, j.interruptible, j.gpu_model, round(j.data_gb), hb, j.checkpoint_minutes)
        c = self.cache.get(key)
        if c is None:
            c = self._choose(j, 2.0 ** (hb / 4.0))
            self.cache[key] = c
        return c

    def _choose(self, j: TraceJob, hours: float) -> Choice:
        d = Demand(gpus=j.gpus, hours=hours, gpu_model=j.gpu_model, data_in_gb=j.data_gb,
                   interruptible=j.interruptible,
                   checkpoint_minutes=j.checkpoint_minutes or self.cfg.checkpoint_minutes)
        offers = self.catalog.by_gpu.get(j.gpu_model, ())
        priced: list[PricedOffer] = []
        for o in offers:
            r = price(d, o, self.ctx)
            if type(r) is not Exclusion:
                priced.append(r)
        if not priced:
            return Choice(None, None, 0.0, 0)

        def pick(p: PricedOffer) -> Pick:
            return Pick(p.offering, p.nodes, p.runtime_hours / hours,
                        p.cost.storage + p.cost.data_transfer,
                        float(self.terms[p.offering.provider].startup_s))

        def hourly(p: PricedOffer) -> tuple:
            return (p.offering.hourly_micros * p.nodes * p.runtime_hours, p.cost.total)

        od = [p for p in priced if p.offering.market is not Market.SPOT]
        sp = [p for p in priced if p.offering.market is Market.SPOT]
        best_od_full = min(od, key=lambda p: p.cost.total) if od else None
        lb = min(priced, key=lambda p: p.cost.compute + p.cost.storage + p.cost.data_transfer)
        lb_rate = lb.cost.compute / (hours * 3600.0)
        lb_extra = lb.cost.storage + lb.cost.data_transfer
        m = self.policy.market
        if m == "ondemand-cheapest":
            od_cheap = [p for p in od if p.offering.market is Market.ON_DEMAND] or od
            first = min(od_cheap, key=hourly) if od_cheap else None
            fb = first
        elif m == "spot-greedy":
            od_cheap = min(od, key=hourly) if od else None
            first = min(sp, key=hourly) if sp else od_cheap
            fb = od_cheap
        else:
            first = min(priced, key=lambda p: p.cost.total)
            fb = best_od_full
            if first.offering.market is Market.SPOT and fb is not None and not self.spot_in_time(first, d):
                first = fb
        best_sp = min(sp, key=lambda p: p.cost.total) if sp else None
        return Choice(pick(first) if first else None, pick(fb) if fb else None, lb_rate, lb_extra,
                      pick(best_od_full) if best_od_full else None, pick(best_sp) if best_sp else None)

    def spot_in_time(self, p: PricedOffer, d: Demand) -> bool:
        """Whether the job, run on spot to the end, meets its deadline (start-up + runtime x
        (1 + slack)) with the policy's confidence, by the observed lifetimes."""
        dist = self.lives.get(p.offering.provider) if self.lives else None
        if dist is None:
            return True
        startup_h = self.terms[p.offering.provider].startup_s / 3600.0
        o = outlook(dist, p.runtime_hours, d.checkpoint_hours, startup_h, p.nodes)
        deadline_h = startup_h + p.runtime_hours * (1.0 + self.policy.deadline_slack)
        return o.finish_by_h(self.policy.spot_confidence) <= deadline_h
