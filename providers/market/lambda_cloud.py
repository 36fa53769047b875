"""Lambda Cloud's market: ``GET /api/v1/instance-types`` gives each type's price
(``price_cents_per_hour``, per instance) and the regions that have capacity for it now.

Lambda has one price per type everywhere, no spot market, no quota API and no zones. A region
without capacity for a type is recorded as offering it in no zone (``Zones(region, type, ())``),
which the overlay turns into "nothing left" for quotes; a region with capacity keeps the
catalog's (empty) zones. Everything comes from one call, so prices and zones fail together.
"""
from __future__ import annotations

from typing import Any, Mapping

from providers.lambda_cloud.settings import LambdaSettings
from providers.market import LivePrice, Quota, QuotaNeed, Snapshot, Zones, instance_types, rfc3339
from providers.settings import provider_table

SOURCE = "lambda:instance_types"


def _cents_to_micros(cents: int | str) -> int:
    return int(cents) * 10_000


def fetch(raw: Mapping[str, Any], catalog: Any, now: float) -> Snapshot:
    from providers.lambda_cloud.client import ApiKey, LambdaClient

    settings = provider_table(LambdaSettings, "lambda", raw)
    types = instance_types(catalog, "lambda")
    regions = sorted(set(settings.regions) or {r for (p, r) in catalog.regions if p == "lambda"})
    snap = Snapshot("lambda", now)
    snap.asked("prices")
    snap.asked("zones")
    client = LambdaClient(settings, ApiKey.load(settings))
    try:  # the one call: when it fails, nothing of this refresh is worth storing (its typed error says why)
        offered = client.instance_types()
    finally:
        client.close()
    stamp = rfc3339(now)
    for name in sorted(types):
        avail = offered.get(name)
        if avail is None:
            continue
        micros = _cents_to_micros(avail.instance_type.price_cents_per_hour)
        with_capacity = {r.name for r in avail.regions_with_capacity_available}
        for region in regions:
            snap.prices.append(LivePrice(region, name, "on_demand", micros, SOURCE, stamp))
            if region not in with_capacity:
                snap.zones.append(Zones(region, name, ()))
    return snap


class LambdaMarket:
    """Lambda Cloud's :class:`providers.market.MarketSource`: prices and where there is capacity,
    from one call. Lambda publishes no quota API: a quota error blocks the offering instead."""

    sources = ("price_list", "zones")

    def fetch(self, settings: Any, catalog: Any, now: float) -> Snapshot:
        return fetch(settings, catalog, now)

    def quotas(self, settings: Any, catalog: Any, region: str, known: Snapshot | None) -> list[Quota]:
        return []

    def needs(self, catalog: Any, known: Snapshot | None) -> list[QuotaNeed]:
        return []


MARKET = LambdaMarket()

