"""Live market data over the bundled catalog: what a quote uses, with where each price came from.

The bundled catalog stays the offline fallback: an offering with no (plausible) live price keeps
its list price, marked ``bundled:<date>``. A live price is used only when it is plausible, between
5 % and 300 % of the same offering's list price (spot against the bundled spot price when there
is one): a mock or a bad page that says $0.00001 is refused with a warning, never used.

Per offering the overlay also sets the zones the cloud says it is sold in (spot: cheapest zone
first), the account quota it draws on, the spot interruption rate and its signal, and adds one
reserved offering per capacity reservation with free nodes, at marginal cost 0 (the reservation
is paid whether used or not), and one queued offering per capacity block on sale (its start,
run and up-front fee).
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import operator
from typing import Iterable, Mapping

from providers.base import Market, Offering
from providers.market import LivePrice, Snapshot, rfc3339

MIN_PLAUSIBLE = 0.05
MAX_PLAUSIBLE = 3.0
# Observed interruptions are trusted over the placement score after this much spot exposure.
MIN_OBSERVED_NODE_HOURS = 10.0


@functools.lru_cache(maxsize=4096)
def epoch(text: str) -> float:
    """Seconds since the epoch of an ISO date or RFC 3339 time (0 when unparseable); remembered,
    since a catalog's hundreds of offerings share a few dates."""
    t = (text or "").strip()
    if not t:
        return 0.0
    try:
        if len(t) == 10:
            return dt.datetime.fromisoformat(t).replace(tzinfo=dt.timezone.utc).timestamp()
        v = dt.datetime.fromisoformat(t.replace("Z", "+00:00"))
        return (v if v.tzinfo else v.replace(tzinfo=dt.timezone.utc)).timestamp()
    except ValueError:
        return 0.0


@functools.cache
def _layout() -> tuple[operator.attrgetter, dict[str, int]]:
    names = tuple(f.name for f in dataclasses.fields(Offering))
    return operator.attrgetter(*names), {n: i for i, n in enumerate(names)}


def _replace(o: Offering, changes: dict) -> Offering:
    """``dataclasses.replace(o, **changes)`` without its introspection on every call (a third
    of what laying the market over the catalog cost a cold `broker quote`)."""
    get, index = _layout()
    values = list(get(o))
    for k, v in changes.items():
        values[index[k]] = v
    return Offering(*values)


def score_rate(base: float, score: float) -> float:
    """Interruptions per node-hour from an AWS spot placement score (1-10, 10 = most likely to
    be fulfilled): the catalog rate halved for every 2 points above the middle, doubled for every
    2 below. A heuristic: the score is the cloud's own view of spare capacity, which is what
    reclaims spot."""
    return base * 2.0 ** ((5.5 - score) / 2.0)


def plausible(live: int, reference: int) -> str:
    """"" when ``live`` is a plausible price next to ``reference``, else why not."""
    if reference <= 0:
        return ""
    ratio = live / reference
    if ratio < MIN_PLAUSIBLE:
        return f"under {MIN_PLAUSIBLE:.0%} of the list price ${reference / 1e6:,.2f}/h"
    if ratio > MAX_PLAUSIBLE:
        return f"over {MAX_PLAUSIBLE:.0%} of the list price ${reference / 1e6:,.2f}/h"
    return ""


def _latest(prices: Iterable[LivePrice]) -> dict[tuple[str, str, str], list[LivePrice]]:
    """The newest price per (region, instance type, market, zone), grouped by (region, instance
    type, market): what one offering looks up."""
    out: dict[tuple[str, str, str, str], LivePrice] = {}
    for p in prices:
        key = (p.region, p.instance_type, p.market, p.zone)
        if key not in out or epoch(p.as_of) >= epoch(out[key].as_of):
            out[key] = p
    grouped: dict[tuple[str, str, str], list[LivePrice]] = {}
    for (region, name, market, _zone), p in out.items():
        grouped.setdefault((region, name, market), []).append(p)
    return grouped


def overlay(catalog, snapshots: Mapping[str, Snapshot], *, now: float, max_age_h: float,
            observed: Mapping[tuple[str, str, str], tuple[int, float]] | None = None):
    """``catalog`` with the live data of ``snapshots`` laid over it; returns (catalog, warnings).

    ``observed`` maps (provider, region, instance type) to (interruptions, spot node-hours) seen
    by this broker; ``max_age_h`` <= 0 never marks a price stale.
    """
    from providers.catalog import Catalog

    warnings: list[str] = []
    observed = observed or {}
    max_age_s = max_age_h * 3600.0
    bundled_od = {(o.provider, o.region, o.instance.name): o.hourly_micros
                  for o in catalog.offerings if o.market is Market.ON_DEMAND}
    live: dict[str, dict] = {}
    for p, snap in snapshots.items():
        zones = {(z.region, z.instance_type): z.zones for z in snap.zones}
        need = {(n.instance_type, n.market): n for n in snap.needs}
        quota = {(q.region, q.key): q for q in snap.quotas}
        scores = {(s.region, s.instance_type): s for s in snap.spot}
        live[p] = dict(prices=_latest(snap.prices), zones=zones, need=need, quota=quota, scores=scores,
                       as_of=rfc3339(snap.fetched_at))

    out: list[Offering] = []
    for o in catalog.offerings:
        p, region, name, market = o.provider, o.region, o.instance.name, o.market.value
        changes: dict = {"price_source": f"bundled:{o.as_of}"}
        as_of = o.as_of
        data = live.get(p)
        if data is not None and o.market is not Market.RESERVED:
            changes.update(_price(o, data["prices"], bundled_od, warnings, data["as_of"]))
            as_of = changes.get("as_of", as_of)
            zones = data["zones"].get((region, name))
            ordered = changes.pop("_zone_order", None)
            if zones or (zones is None and ordered):  # the live zones, else the catalog's
                zones = zones or o.zones
                if ordered:  # priced per zone: cheapest first, where a launch goes
                    zones = tuple(sorted(zones, key=lambda z: (ordered.get(z, float("inf")), z)))
                changes["zones"] = zones
            n = data["need"].get((name, market))
            q = data["quota"].get((region, n.key)) if n is not None else None
            if zones == ():
                changes.update(quota_left=0.0, quota_limit=0.0, quota_per_node=1.0,
                               quota_label=f"{name} nodes (not offered to this account)")
            elif q is not None:
                changes.update(quota_left=q.left, quota_limit=q.limit, quota_per_node=n.per_node,
                               quota_label=q.label)
        changes.pop("_zone_order", None)
        if o.market is Market.SPOT:
            changes.update(_spot_rate(catalog.terms[p].spot_interruptions_per_hour,
                                      observed.get((p, region, name)),
                                      (data or {}).get("scores", {}).get((region, name))))
        changes["stale"] = max_age_s > 0 and now - epoch(as_of) > max_age_s
        out.append(_replace(o, changes))

    for p, snap in snapshots.items():
        out += _reservations(catalog, p, snap)
        out += _blocks(catalog, p, snap, now)
    return Catalog(catalog.instances, catalog.regions, catalog.terms, catalog.gpu_perf, tuple(out),
                   catalog.committed_micros, catalog.as_of), warnings


def _price(o: Offering, prices: Mapping, bundled_od: Mapping, warnings: list[str], fetched: str) -> dict:
    """The plausible live price of ``o`` (the cheapest zone's), as of when it was fetched: the
    cloud said then that this is its price (its own effective date may be months earlier)."""
    p, region, name, market = o.provider, o.region, o.instance.name, o.market.value
    candidates = prices.get((region, name, market))
    if not candidates:
        return {}
    reference = o.hourly_micros if o.hourly_micros > 0 else bundled_od.get((p, region, name), 0)
    good, zone_price = [], {}
    for lp in candidates:
        why = plausible(lp.hourly_micros, reference)
        if why:
            where = f" {lp.zone}" if lp.zone else ""
            warnings.append(f"refused {lp.source} price ${lp.hourly_micros / 1e6:,.5f}/h for {p} {region}{where} "
                            f"{name} {market}: {why}")
            continue
        good.append(lp)
        if lp.zone:
            zone_price[lp.zone] = lp.hourly_micros
    if not good:
        return {}
    best = min(good, key=lambda lp: lp.hourly_micros)
    out = {"hourly_micros": best.hourly_micros, "as_of": fetched, "price_source": best.source,
           "source": best.source}
    if zone_price:
        out["_zone_order"] = zone_price
    return out


def _spot_rate(base: float, seen: tuple[int, float] | None, score) -> dict:
    if seen is not None and seen[1] >= MIN_OBSERVED_NODE_HOURS:
        return {"spot_rate": seen[0] / seen[1], "spot_rate_source": "observed"}
    if score is not None:
        return {"spot_rate": score_rate(base, score.score), "spot_rate_source": score.source}
    return {"spot_rate": base, "spot_rate_source": "catalog"}


def _reservations(catalog, provider: str, snap: Snapshot) -> list[Offering]:
    out = []
    for r in snap.reservations:
        it = catalog.instance(provider, r.instance_type)
        reg = catalog.region(provider, r.region)
        if it is None or reg is None:
            continue
        out.append(Offering(
            instance=it, region=r.region, zones=(r.zone,) if r.zone else reg.zones, market=Market.RESERVED,
            hourly_micros=0, sla_pct=catalog.terms[provider].sla_pct, as_of=rfc3339(snap.fetched_at),
            source=f"{provider}:reservation", reservation=r.reservation_id,
            reserved_nodes=max(0, r.total - r.used), price_source=f"{provider}:reservation",
        ))
    return out


def _blocks(catalog, provider: str, snap: Snapshot, now: float) -> list[Offering]:
    """One queued offering per capacity block on sale that has not started by ``now``: its start,
    its run, the fee per node paid up front, and that fee spread over the block's hours."""
    out = []
    for b in snap.blocks:
        it = catalog.instance(provider, b.instance_type)
        reg = catalog.region(provider, b.region)
        start = epoch(b.start)
        if it is None or reg is None or b.count < 1 or b.duration_h <= 0 or start < now:
            continue
        per_node = b.upfront_micros // b.count
        out.append(Offering(
            instance=it, region=b.region, zones=(b.zone,) if b.zone else reg.zones, market=Market.QUEUED,
            hourly_micros=int(per_node / b.duration_h), sla_pct=catalog.terms[provider].sla_pct,
            as_of=rfc3339(snap.fetched_at), source=f"{provider}:capacity_block",
            price_source=f"{provider}:capacity_block", starts_at=start, max_run_h=b.duration_h,
            upfront_micros=per_node, offer_id=b.offering_id,
        ))
    return out
