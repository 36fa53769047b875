"""Pricing many offerings at once: the same cost model as :func:`policies.cost.pricer`, in arrays.

A quote over the whole catalog prices hundreds of offerings; doing each one's arithmetic and
checks in Python objects costs microseconds per offering. :class:`Table` holds the columns of a
fixed candidate set (built once per set and reused), and :meth:`Table.price` computes every cost
line with numpy over all of them, turning back into Python objects only the results. Which
offerings are excluded is decided in arrays too; the *sentence* of an excluded one comes from
:func:`policies.cost.offering_reason`, so both paths say exactly the same thing (a test holds them
equal). numpy does the arithmetic in IEEE doubles in the same order as the scalar code, and
truncates to whole micro-dollars the same way, so the figures are identical to the last micro.
"""
from __future__ import annotations

import math
from itertools import repeat
from typing import Mapping

import numpy as np

from policies.cost import (
    late_reason,
    HOURS_PER_MONTH,
    SHORT_LIVED,
    Context,
    CostLines,
    Exclusion,
    ExclusionKind,
    PricedOffer,
    Reason,
    _transfer_in,
    instance_reason,
    lease_down_share,
    offering_reason,
    runtime_hours,
)
from policies.demand import Demand
from policies.spot import overhead_h as spot_overhead_h
from providers.base import InstanceType, Market, Offering
from providers.catalog import Terms

_MARKET = {Market.ON_DEMAND: 0, Market.SPOT: 1, Market.RESERVED: 2}


class Table:
    """The columns of a candidate set: offerings grouped by shape, in a fixed order."""

    def __init__(self, groups: list[tuple[InstanceType, list[Offering]]], terms: Mapping[str, Terms]) -> None:
        self.groups = groups
        offs = [o for _, g in groups for o in g]
        self.offerings = offs
        self.shape = np.array([i for i, (_, g) in enumerate(groups) for _ in g], dtype=np.intp)
        self.providers = sorted({o.instance.provider for o in offs})
        pidx = {p: i for i, p in enumerate(self.providers)}
        self.provider = np.array([pidx[o.instance.provider] for o in offs], dtype=np.intp)
        self.places = sorted({(o.instance.provider, o.region) for o in offs})
        ridx = {k: i for i, k in enumerate(self.places)}
        self.place = np.array([ridx[(o.instance.provider, o.region)] for o in offs], dtype=np.intp)
        self.place_offering: dict[tuple[str, str], Offering] = {}  # one offering per place (to price transfers from)
        for o in offs:
            self.place_offering.setdefault((o.instance.provider, o.region), o)
        self.hourly = np.array([o.hourly_micros for o in offs], dtype=np.int64)
        self.market = np.array([_MARKET[o.market] for o in offs], dtype=np.int8)
        self.sla = np.array([o.sla_pct for o in offs], dtype=np.float64)
        self.rate = np.array([o.spot_rate if o.spot_rate >= 0 else terms[o.instance.provider].spot_interruptions_per_hour
                              for o in offs], dtype=np.float64)
        self.quota_left = np.array([o.quota_left for o in offs], dtype=np.float64)
        self.quota_per_node = np.array([o.quota_per_node for o in offs], dtype=np.float64)
        self.zone = [o.zones[0] if o.zones else "" for o in offs]  # where an offer is placed first
        self.starts = np.cumsum([0] + [len(g) for _, g in groups[:-1]])  # where each shape's offerings begin
        self._excluded: dict[tuple[int, str], list[Exclusion]] = {}
        triples = sorted({(o.instance.provider, o.region, o.instance.name) for o in offs})
        rank = {t: i for i, t in enumerate(triples)}
        self.name_rank = np.array([rank[(o.instance.provider, o.region, o.instance.name)] for o in offs],
                                  dtype=np.int64)
        self.reserved = [i for i, o in enumerate(offs) if o.market is Market.RESERVED and o.reservation]
        self.startup_h = np.array([terms[p].startup_s / 3600.0 for p in self.providers], dtype=np.float64)
        self.storage = np.array([terms[p].storage_micros_per_gb_month for p in self.providers], dtype=np.float64)

    def price(self, d: Demand, ctx: Context, top: int = 0) -> tuple[list[PricedOffer], list[Exclusion]]:
        """The offerings of the set that serve ``d``, priced, in rank order (the first ``top``;
        0 = all), and every other one excluded with its reason (in set order)."""
        n = len(self.offerings)
        shape_reasons: list[Reason | None] = []
        shape_nodes: list[int] = []
        shape_hours: list[float] = []
        for it, _ in self.groups:
            reason, count = instance_reason(d, it)
            shape_reasons.append(reason)
            shape_nodes.append(count)
            shape_hours.append(0.0 if reason else runtime_hours(d, it, count, ctx.gpu_perf))
        fits = np.array([r is None for r in shape_reasons], dtype=bool)[self.shape]
        nodes = np.array(shape_nodes, dtype=np.int64)[self.shape]
        run_h = np.array(shape_hours, dtype=np.float64)[self.shape]

        bad = self._ruled_out(d, ctx, nodes)
        terms = ctx.terms
        gang = self.hourly * nodes
        compute = np.trunc(gang.astype(np.float64) * run_h)
        startup_h = self.startup_h[self.provider]
        spot = self.market == 1
        expected = self.rate * nodes * run_h
        rework_h = d.checkpoint_hours / 2.0 + startup_h
        lost_h = np.where(spot, expected * rework_h, 0.0)
        short = self._by_lifetimes(lost_h, d, ctx, fits & spot, nodes, run_h, startup_h)
        interruption = np.where(spot & ~short, np.trunc(lost_h * gang), 0.0)
        wall_h = run_h + startup_h + np.where(short, 0.0, lost_h)
        late = (ctx.now + wall_h * 3600.0 > d.deadline) if d.deadline is not None else np.zeros(n, dtype=bool)
        late &= ~short
        data_gb = d.data_in_gb + d.data_out_gb
        storage = np.trunc(data_gb * self.storage[self.provider] * wall_h / HOURS_PER_MONTH) if data_gb \
            else np.zeros(n)
        t_in = np.array([_transfer_in(d, self.place_offering[k], ctx, terms[k[0]]) for k in self.places],
                        dtype=np.int64)[self.place]
        t_out = np.array([terms[p].egress_micros(d.data_out_gb) for p in self.providers], dtype=np.int64)[self.provider]
        sla_risk = self._sla_risk(compute, nodes)

        # The offers, made in rank order (reserved first, then total, hourly price, provider,
        # region, instance type; ties keep the set order, as a stable sort does): only ``top``.
        valid = fits & ~bad & ~late & ~short
        idx = np.flatnonzero(valid)
        lines = np.stack([compute, interruption, storage, (t_in + t_out).astype(np.float64), sla_risk])[:, idx]
        lines = lines.astype(np.int64)
        total = lines.sum(axis=0)
        order = np.lexsort((self.name_rank[idx], self.hourly[idx], total, self.market[idx] != 2))
        if top:
            order = order[:top]
        sel = idx[order]
        at = sel.tolist()
        offs = self.offerings
        # tuple.__new__ over columns: a NamedTuple's own __new__ is a Python call per row.
        costs = map(tuple.__new__, repeat(CostLines), zip(*lines[:, order].tolist()))
        ok = list(map(tuple.__new__, repeat(PricedOffer),
                      zip(map(offs.__getitem__, at), nodes[sel].tolist(), run_h[sel].tolist(), costs,
                          map(self.zone.__getitem__, at))))

        # The excluded, in set order: whole shapes (their exclusions made once, then reused), and
        # the offerings of serving shapes that the demand's other terms rule out.
        out: list[Exclusion] = []
        dropped = np.flatnonzero(fits & ~valid)
        cut = np.searchsorted(dropped, self.starts).tolist() + [len(dropped)]
        dropped_l, late_l, bad_l = dropped.tolist(), late[dropped].tolist(), bad[dropped].tolist()
        short_l = short[dropped].tolist()
        wall_l, nodes_l = wall_h[dropped].tolist(), nodes[dropped].tolist()
        for gi, reason in enumerate(shape_reasons):
            if reason is not None:  # the shape cannot serve the demand anywhere
                out.extend(self._shape_exclusions(gi, reason))
                continue
            for k in range(cut[gi], cut[gi + 1]):
                o = offs[dropped_l[k]]
                if short_l[k] and not bad_l[k]:
                    out.append(Exclusion(o, SHORT_LIVED, ExclusionKind.MARKET))
                elif late_l[k] and not bad_l[k]:
                    out.append(Exclusion(o, late_reason(o, wall_l[k], ctx), ExclusionKind.DEADLINE))
                else:
                    r = offering_reason(d, o, nodes_l[k], ctx)
                    assert r is not None, "an offering dropped for no other term has a reason of its own"
                    out.append(Exclusion(o, r.text, r.kind))
        return ok, out

    def _sla_risk(self, compute: np.ndarray, nodes: np.ndarray) -> np.ndarray:
        """The scalar model's share, per distinct (SLA, nodes) pair: the same floats, so the same cents."""
        if not len(compute):
            return np.zeros(0)
        pairs, back = np.unique(np.stack([self.sla, nodes.astype(np.float64)]), axis=1, return_inverse=True)
        share = np.array([lease_down_share(float(a), int(k)) for a, k in pairs.T], dtype=np.float64)
        return np.where(self.sla > 0, np.trunc(compute * share[back.reshape(-1)]), 0.0)

    def _by_lifetimes(self, lost_h: np.ndarray, d: Demand, ctx: Context, spot: np.ndarray, nodes: np.ndarray,
                      run_h: np.ndarray, startup_h: np.ndarray) -> np.ndarray:
        """Where the context has observed lifetimes for an offer's cloud, its spot loss (in
        ``lost_h``, in place) by them, as :func:`policies.spot.overhead_h` gives it, once per
        (cloud, nodes, runtime); returns where spot nodes die before a first checkpoint."""
        short = np.zeros(len(lost_h), dtype=bool)
        if not ctx.spot_lifetimes or not d.interruptible:
            return short
        seen: dict[tuple[str, int, float], float] = {}
        for i in np.flatnonzero(spot).tolist():
            provider = self.providers[self.provider[i]]
            dist = ctx.spot_lifetimes.get(provider)
            if dist is None:
                continue
            key = (provider, int(nodes[i]), float(run_h[i]))
            h = seen.get(key)
            if h is None:
                h = seen[key] = spot_overhead_h(key[2], key[1], d.checkpoint_hours, float(startup_h[i]),
                                                float(self.rate[i]), dist)
            if h == math.inf:
                short[i] = True
            else:
                lost_h[i] = h
        return short

    def _shape_exclusions(self, gi: int, reason: Reason) -> list[Exclusion]:
        """The exclusions of a whole shape for one reason (made once, then reused)."""
        key = (gi, reason.text)
        hit = self._excluded.get(key)
        if hit is None:
            if len(self._excluded) > 4096:
                self._excluded.clear()
            hit = self._excluded[key] = [Exclusion(o, reason.text, reason.kind) for o in self.groups[gi][1]]
        return hit

    def _ruled_out(self, d: Demand, ctx: Context, nodes: np.ndarray) -> np.ndarray:
        """Where :func:`policies.cost.offering_reason` would give a reason, as a mask."""
        place_bad = []
        for provider, region in self.places:
            why = (d.providers and provider not in d.providers) or (d.regions and region not in d.regions)
            if not why and d.residency:
                reg = ctx.regions.get((provider, region))
                geo = reg.geo if reg else "?"
                why = geo not in d.residency and region not in d.residency
            place_bad.append(bool(why))
        bad = np.array(place_bad, dtype=bool)[self.place]
        if not d.interruptible:
            bad |= self.market == 1
        bad |= (self.quota_left >= 0) & (nodes * self.quota_per_node > self.quota_left)
        if d.min_sla_pct:
            bad |= self.sla < d.min_sla_pct
        if self.reserved or ctx.blocked:
            extra = [i for i in (range(len(self.offerings)) if ctx.blocked else self.reserved)
                     if not bad[i] and offering_reason(d, self.offerings[i], int(nodes[i]), ctx) is not None]
            bad[extra] = True
        return bad
