"""Lambda Cloud's market: ``GET /api/v1/instance-types`` gives each type's price
(``price_cents_per_hour``, per instance) and the regions that have capacity for it now.

Lambda has one price per type everywhere, no spot market, no quota API and no zones. A region
without capacity for a type is recorded as offering it in no zone (``Zones(region, type, ())``),
which the overlay turns into "nothing left" for quotes; a region with capacity keeps the
catalog's (empty) zones. Everything comes from one call, so prices and zones fail together.
"""
from __future__ import annotations

from typing import Any, Mapping

from providers.market import LivePrice, Quota, Snapshot, Zones, instance_types, rfc3339
from providers.settings import LambdaSettings, provider_settings

SOURCE = "lambda:instance_types"


def _cents_to_micros(cents: int | str) -> int:
    return int(cents) * 10_000


def fetch(raw: Mapping[str, Any], catalog: Any, now: float) -> Snapshot:
    from providers.lambda_cloud import ApiKey, LambdaClient

    settings = provider_settings("lambda", raw)
    assert isinstance(settings, LambdaSettings)
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


def fetch_quotas(raw: Mapping[str, Any], catalog: Any, region: str) -> list[Quota]:
    """Lambda publishes no quota API: nothing to refresh (a quota error blocks the offer instead)."""
    return []

