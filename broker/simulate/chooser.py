"""Where a burst job goes: the offering each policy picks from the catalog, cached per job shape."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from policies.cost import Context, Exclusion, PricedOffer, price
from policies.demand import Demand
from providers.base import MICROS, Market, Offering
from providers.catalog import Catalog

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


def hours_bucket(h: float) -> int:
    return int(round(4 * math.log2(max(h, 1 / 60))))


class Chooser:
    """Prices a job's shape once per (size, market eligibility, model, data, runtime bucket) and
    remembers the policy's pick; learns spot interruption rates when the policy does."""

    def __init__(self, catalog: Catalog, policy: Policy, cfg: SimConfig):
        self.catalog = catalog
        self.policy = policy
        self.cfg = cfg
        self.cache: dict[tuple, Choice] = {}
        self.terms = dict(catalog.terms)
        self.ctx = Context(self.terms, catalog.regions, catalog.gpu_perf, 0.0,
                           int(cfg.onprem_egress_usd_per_gb * MICROS))
        # Learned spot interruption rates: provider -> [node-hours seen, interruptions seen].
        self.seen: dict[str, list[float]] = {p: [0.0, 0.0] for p in catalog.terms}
        self.rates_in_use = {p: t.spot_interruptions_per_hour for p, t in catalog.terms.items()}

    def observe(self, provider: str, node_hours: float, interrupted: int) -> None:
        if not self.policy.learn_interruptions:
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
        return Choice(pick(first) if first else None, pick(fb) if fb else None, lb_rate, lb_extra)
