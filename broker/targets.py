"""What a lease asks one cloud for: :class:`Target`, the same record from a quote's offer to the
cloud call (stored by :mod:`broker.records`' codec; apart from it so that a quote, which makes
targets but stores none in-process, does not load the codec).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from providers.base import Market


@dataclass(frozen=True, slots=True)
class Target:
    """One launchable offering: what a lease asks one cloud for (an offer of a quote, a failover
    alternative, or an explicit launch). The same record from the quote to the cloud call."""

    provider: str
    region: str
    zone: str
    instance_type: str
    market: Market
    nodes: int
    hourly_micros: int  # per node
    # The capacity reservation (reserved), or the Capacity Block offering to buy (queued, "cb-...").
    reservation: str = ""

    @classmethod
    def of(cls, r: Any) -> "Target":
        """The target of a quote's ranked offer (:class:`broker.quote.RankedOffer`)."""
        o = r.priced.offering
        return cls(o.instance.provider, o.region, r.priced.zone, o.instance.name, o.market, r.priced.nodes,
                   o.hourly_micros, o.reservation or o.offer_id)
