"""Domain objects as JSON-friendly dicts: the one shape shared by the CLI, the store and tests."""
from __future__ import annotations

import datetime as dt
from typing import Any

from policies.cost import PricedOffer
from policies.demand import Demand
from broker.quote import Quote, usd


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def as_of(text: str) -> str:
    """A catalog or price date as RFC 3339 in UTC, like every other timestamp in the JSON
    ("2025-06-01" -> "2025-06-01T00:00:00Z"); empty stays empty, anything unreadable as it is."""
    t = (text or "").strip()
    if not t:
        return ""
    try:
        d = dt.datetime.fromisoformat(t.replace("Z", "+00:00"))
    except ValueError:
        return t
    if d.tzinfo is None:
        d = d.replace(tzinfo=dt.timezone.utc)
    return d.astimezone(dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def parse_iso(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def demand_to_dict(d: Demand) -> dict[str, Any]:
    return {
        "gpu_model": d.gpu_model, "min_gpu_memory_gb": d.min_gpu_memory_gb, "gpus": d.gpus,
        "nodes": d.nodes, "hours": d.hours, "data_in_gb": d.data_in_gb,
        "data_location": d.data_location, "data_out_gb": d.data_out_gb,
        "interruptible": d.interruptible, "checkpoint_minutes": d.checkpoint_minutes,
        "providers": list(d.providers), "regions": list(d.regions), "residency": list(d.residency),
        "min_sla_pct": d.min_sla_pct, "deadline": iso(d.deadline), "tenant": d.tenant,
    }


def demand_from_dict(m: dict[str, Any]) -> Demand:
    deadline = m.get("deadline")
    return Demand(
        gpus=int(m["gpus"]), hours=float(m["hours"]), gpu_model=m.get("gpu_model", ""),
        min_gpu_memory_gb=int(m.get("min_gpu_memory_gb", 0)), nodes=int(m.get("nodes", 0)),
        data_in_gb=float(m.get("data_in_gb", 0)), data_location=m.get("data_location", "onprem"),
        data_out_gb=float(m.get("data_out_gb", 0)), interruptible=bool(m.get("interruptible", False)),
        checkpoint_minutes=int(m.get("checkpoint_minutes", 0)), providers=tuple(m.get("providers", ())),
        regions=tuple(m.get("regions", ())), residency=tuple(m.get("residency", ())),
        min_sla_pct=float(m.get("min_sla_pct", 0)),
        deadline=parse_iso(deadline) if isinstance(deadline, str) else deadline,
        tenant=m.get("tenant", "default"),
    )


def _money(micros: int) -> float:
    return float(usd(micros))


def cost_lines(c) -> dict[str, float]:
    """The cost lines in dollars; the total is the sum of the rounded lines, so they add up."""
    lines = {"compute": usd(c.compute), "interruption": usd(c.interruption), "storage": usd(c.storage),
             "data_transfer": usd(c.data_transfer), "sla_risk": usd(c.sla_risk)}
    total = sum(lines.values())
    return {**{k: float(v) for k, v in lines.items()}, "total": float(total)}


def offer_to_dict(rank: int, p: PricedOffer, now: float = 0.0) -> dict[str, Any]:
    o, it, c = p.offering, p.offering.instance, p.cost
    return {
        "rank": rank, "provider": it.provider, "region": o.region, "zone": p.zone,
        "instance_type": it.name, "gpu": it.gpu, "gpus_per_node": it.gpus, "nodes": p.nodes,
        "market": o.market.value, "hourly_usd": _money(o.hourly_micros),
        "interconnect_gbps": it.interconnect_gbps, "sla_pct": o.sla_pct,
        "cost_usd": cost_lines(c), **market_fields(o, now),
    }


def queued_fields(o, now: float) -> dict[str, Any]:
    """For queued capacity (market ``queued``): the earliest start as seen at ``now`` (RFC 3339),
    the fee paid up front for the offering's nodes and the longest run it allows; "" and zeros
    for any other market (the same keys in JSON and in the protobuf Offer / ExcludedOffer)."""
    if o.market.value != "queued":
        return {"starts_at": "", "upfront_usd": 0.0, "max_run_hours": 0.0}
    return {"starts_at": iso(o.start_after(now)) or "", "upfront_usd": _money(o.upfront_micros),
            "max_run_hours": o.max_run_h}


def market_fields(o, now: float = 0.0) -> dict[str, Any]:
    """What a quote knows about an offering's price: when and where it was taken, whether it is
    stale, the zones that sell it and, for spot, the interruption rate priced in and its signal
    (the same keys in JSON and in the protobuf Offer)."""
    spot = o.market.value == "spot"
    return {"price_as_of": as_of(o.as_of), "price_source": o.price_source or f"bundled:{o.as_of}", "stale": o.stale,
            "zones": list(o.zones), "interruptions_per_hour": max(0.0, o.spot_rate) if spot else 0.0,
            "interruption_source": o.spot_rate_source if spot else "", **queued_fields(o, now)}


def quote_to_dict(q: Quote) -> dict[str, Any]:
    return {
        "quote_id": q.quote_id,
        "valid_until": iso(q.valid_until),
        "catalog_as_of": as_of(q.catalog_as_of),
        "demand": demand_to_dict(q.demand),
        "offers": [offer_to_dict(r.rank, r.priced, q.created_at) for r in q.offers],
        "excluded": [
            {"provider": e.offering.instance.provider, "region": e.offering.region,
             "instance_type": e.offering.instance.name, "market": e.offering.market.value,
             "kind": e.kind.value, "reason": e.reason, **queued_fields(e.offering, q.created_at)}
            for e in q.excluded
        ],
        "spot_model": q.spot_model,
        "prices_only": q.prices_only,
    }
