"""Where a burst job goes: the offering each policy picks from the catalog, cached per job shape.

Pricing a shape (every offering of its GPU model through :func:`policies.cost.pricer`) is the
costly part, and it does not depend on the policy or the pool size: the priced offers are kept
per (catalog, pricing context, shape) in :data:`_PRICED`, shared by every replay in the process
(the policies of one run, the sizes of a sweep's worker). Each replay keeps the policy's pick per
shape and per job.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

from policies.cost import Context, Exclusion, PricedOffer, pricer
from policies.demand import Demand
from policies.lifetimes import Lifetimes
from policies.spot_choice import SpotModel, first_choice
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
    od_best: Pick | None = None  # lowest full cost off spot (for the hindsight bound)
    spot_best: Pick | None = None  # lowest full cost on spot
    price_ratio: float = 1.0  # first pick's hourly gang price / the fallback's (at most 1)
    startup_s: float = math.inf  # the first pick's start-up (inf: no offer)


# Priced offers per (pricing context, shape), shared by the replays of one process; reset when
# another catalog comes.
_PRICED: dict[tuple, tuple[PricedOffer, ...]] = {}
_PRICED_CATALOG: list = [None]
_PRICED_MAX = 4_000  # shapes x pricing contexts (a few hundred shapes per trace)


def hours_bucket(h: float) -> int:
    return int(round(4 * math.log2(max(h, 1 / 60))))


class Chooser:
    """Prices a job's shape once per (size, market eligibility, model, data, runtime bucket) and
    remembers the policy's pick; learns spot interruption rates when the policy does."""

    def __init__(self, catalog: Catalog, policy: Policy, cfg: SimConfig, lifetimes: Lifetimes | None = None,
                 jobs: Sequence[TraceJob] = ()):
        self.catalog = catalog
        self.jobs = jobs
        self.per_job: list[Choice | None] = [None] * len(jobs)
        self.policy = policy
        self.cfg = cfg
        self.cache: dict[tuple, Choice] = {}
        self.terms = dict(catalog.terms)
        # The full-cost policy knows the observed lifetime distribution and prices spot by it.
        self.lives = lifetimes.distributions() if lifetimes is not None and policy.market == "full-cost" else None
        # The quote's spot rule (policies.spot_choice), with the policy's confidence and slack.
        self.spot = SpotModel(self.lives or {}, policy.spot_confidence, policy.deadline_slack)
        self.startup_h = {p: t.startup_s / 3600.0 for p, t in self.terms.items()}
        self.ctx = Context(self.terms, catalog.regions, catalog.gpu_perf, 0.0,
                           int(cfg.onprem_egress_usd_per_gb * MICROS), spot_lifetimes=self.lives)
        # Learned spot interruption rates: provider -> [node-hours seen, interruptions seen].
        self.seen: dict[str, list[float]] = {p: [0.0, 0.0] for p in catalog.terms}
        self.rates_in_use = {p: t.spot_interruptions_per_hour for p, t in catalog.terms.items()}
        self.ctx_key = self._ctx_key()

    def _ctx_key(self) -> tuple:
        """What the prices depend on besides the catalog and the shape."""
        return (tuple(sorted(self.lives.items())) if self.lives else None, tuple(sorted(self.rates_in_use.items())),
                self.ctx.onprem_egress_micros_per_gb, self.cfg.checkpoint_minutes)

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
            self.ctx_key = self._ctx_key()
            self.cache.clear()
            self.per_job = [None] * len(self.jobs)

    def choose(self, j: TraceJob) -> Choice:
        hb = hours_bucket(j.duration_s / 3600.0)
        key = (j.gpus, j.interruptible, j.gpu_model, round(j.data_gb), hb, j.checkpoint_minutes)
        c = self.cache.get(key)
        if c is None:
            c = self.cache[key] = self._choose(key, 2.0 ** (hb / 4.0))
        return c

    def for_job(self, i: int) -> Choice:
        """:meth:`choose` for job ``i`` of ``jobs``, remembered per job until the rates change."""
        c = self.per_job[i]
        if c is None:
            c = self.per_job[i] = self.choose(self.jobs[i])
        return c

    def priced(self, key: tuple, hours: float) -> tuple[PricedOffer, ...]:
        """Every offering that can serve the shape, priced (shared across replays)."""
        if _PRICED_CATALOG[0] is not self.catalog or len(_PRICED) > _PRICED_MAX:
            _PRICED.clear()
            _PRICED_CATALOG[0] = self.catalog
        k = (self.ctx_key, key, self.cfg.max_nodes)
        out = _PRICED.get(k)
        if out is None:
            gpus, interruptible, model, data_gb, _, ckpt = key
            d = Demand(gpus=gpus, hours=hours, gpu_model=model, data_in_gb=float(data_gb),
                       interruptible=interruptible, checkpoint_minutes=ckpt or self.cfg.checkpoint_minutes)
            one = pricer(d, self.ctx)
            most = self.cfg.max_nodes  # the service refuses a bigger demand before any price
            out = _PRICED[k] = tuple(r for r in map(one, self.catalog.by_gpu.get(model, ()))
                                     if type(r) is not Exclusion and r.nodes <= most)
        return out

    def _choose(self, key: tuple, hours: float) -> Choice:
        priced = self.priced(key, hours)
        if not priced:
            return Choice(None, None, 0.0, 0)
        ckpt = key[5] or self.cfg.checkpoint_minutes

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
            # The quote's choice: the lowest full cost among the offers the job may start on (a
            # spot offer only if it finishes in time on spot, by the observed lifetimes).
            first = first_choice(priced, self.spot, self.startup_h, ckpt / 60.0) \
                or min(priced, key=lambda p: p.cost.total)
            fb = best_od_full
        best_sp = min(sp, key=lambda p: p.cost.total) if sp else None
        f, b = (pick(first) if first else None), (pick(fb) if fb else None)
        ratio = 1.0
        if f is not None and b is not None:
            den = b.offering.hourly_micros * b.nodes * b.stretch
            if den:
                ratio = min(1.0, f.offering.hourly_micros * f.nodes * f.stretch / den)
        return Choice(f, b, lb_rate, lb_extra, pick(best_od_full) if best_od_full else None,
                      pick(best_sp) if best_sp else None, ratio, f.startup_s if f else math.inf)
