"""Azure market data: the Retail Prices API for prices, ARM (``azure-mgmt-compute``) for zones,
quotas and capacity reservations.

- prices: ``GET {retail_prices_url}?api-version=2023-01-01-preview&$filter=serviceName eq 'Virtual
  Machines' and armSkuName eq '<size>' and priceType eq 'Consumption'``, following
  ``NextPageLink`` to the last page. A public, unauthenticated REST API with no SDK, read with the
  standard library. Linux meters only (``productName`` without ``Windows``); ``skuName`` ending
  in ``Spot`` is the spot price, ``Low Priority`` meters are skipped. URL: ``[providers.azure]
  retail_prices_url`` (default the public one).
- zones: ``resource_skus.list(filter="location eq 'L'")``: the location's zones minus the zones
  (or the whole location) a ``NotAvailableForSubscription`` restriction names.
- quotas: ``usage.list(location)``: the VM family's vCPUs (on-demand) and ``lowPriorityCores``
  (spot), limit and current value.
- reservations: ``capacity_reservation_groups.list_by_subscription`` and each group's
  ``capacity_reservations``: capacity and the VMs associated. The reservation id is the group's
  name, which a reserved launch names.
"""
from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Mapping

from azure.core.exceptions import AzureError

from providers.base import ProviderError, TransientError
from providers.azure.settings import AzureSettings
from providers.settings import provider_table
from providers.market import LivePrice, Quota, QuotaNeed, Reservation, Snapshot, Zones, instance_types

RETAIL_API_VERSION = "2023-01-01-preview"
MAX_PAGES = 200
MAX_PAGE_BYTES = 16 * 1024 * 1024  # a page of 1,000 prices is about 1 MB


def retail_prices(url: str, sizes: list[str], regions: set[str], timeout: float) -> list[LivePrice]:
    out: dict[tuple[str, str, str], LivePrice] = {}
    for size in sizes:
        flt = (f"serviceName eq 'Virtual Machines' and armSkuName eq '{size}' "
               f"and priceType eq 'Consumption'")
        link: str | None = f"{url}?{urllib.parse.urlencode({'api-version': RETAIL_API_VERSION, '$filter': flt})}"
        pages = 0
        while link and pages < MAX_PAGES:
            pages += 1
            page = _get_json(link, timeout)
            for item in page.get("Items") or []:
                region = item.get("armRegionName", "")
                sku_name = str(item.get("skuName", ""))
                if (region not in regions or item.get("armSkuName") != size
                        or "windows" in str(item.get("productName", "")).lower()
                        or "low priority" in sku_name.lower() or item.get("unitOfMeasure") != "1 Hour"):
                    continue
                market = "spot" if sku_name.endswith(" Spot") else "on_demand"
                price = LivePrice(region, size, market, int(round(float(item["retailPrice"]) * 1e6)),
                                  "azure:retail_prices", str(item.get("effectiveStartDate", "")))
                key = (region, size, market)
                if key not in out or price.as_of > out[key].as_of:
                    out[key] = price
            link = page.get("NextPageLink") or None
    return list(out.values())


def _get_json(url: str, timeout: float) -> dict[str, Any]:
    req = urllib.request.Request(url, headers={"Accept": "application/json", "User-Agent": "gpu-burst-broker"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            body = resp.read(MAX_PAGE_BYTES + 1)
    except urllib.error.HTTPError as e:
        raise TransientError(f"Retail Prices API answered HTTP {e.code}", provider="azure",
                             code=str(e.code)) from None
    except (urllib.error.URLError, OSError) as e:
        raise TransientError(f"Retail Prices API: {e}", provider="azure", code="RetailPricesUnavailable") from None
    if len(body) > MAX_PAGE_BYTES:
        raise TransientError(f"Retail Prices API answered a page larger than {MAX_PAGE_BYTES:,} bytes",
                             provider="azure", code="RetailPricesUnavailable")
    try:
        return json.loads(body)
    except ValueError as e:
        raise TransientError(f"Retail Prices API: {e}", provider="azure", code="RetailPricesUnavailable") from None


def zones_and_families(client: Any, region: str, sizes: set[str]) -> tuple[list[Zones], dict[str, str]]:
    zones_out, families = [], {}
    for sku in client.resource_skus.list(filter=f"location eq '{region}'"):
        if sku.resource_type != "virtualMachines" or sku.name not in sizes:
            continue
        families[sku.name] = sku.family or ""
        zones: set[str] = set()
        for info in sku.location_info or []:
            if (info.location or "").lower() == region:
                zones |= set(info.zones or [])
        blocked_location = False
        for r in sku.restrictions or []:
            if r.reason_code != "NotAvailableForSubscription":
                continue
            if r.type == "Location" and region in [v.lower() for v in r.values_property or []]:
                blocked_location = True
            elif r.type == "Zone" and r.restriction_info is not None:
                zones -= set(r.restriction_info.zones or [])
        if blocked_location:
            zones_out.append(Zones(region, sku.name, ()))
        elif zones:
            zones_out.append(Zones(region, sku.name, tuple(sorted(zones))))
    return zones_out, families


def quotas_of(client: Any, region: str, names: set[str]) -> list[Quota]:
    return [Quota(region, u.name.value, u.name.localized_value or u.name.value, float(u.limit),
                  float(u.current_value))
            for u in client.usage.list(region) if u.name.value in names]


def reservations_of(client: Any, regions: set[str]) -> list[Reservation]:
    out = []
    for group in client.capacity_reservation_groups.list_by_subscription():
        location = (group.location or "").replace(" ", "").lower()
        if location not in regions:
            continue
        rg = re.search(r"/resourceGroups/([^/]+)/", group.id or "", re.I)
        if rg is None:
            continue
        for r in client.capacity_reservations.list_by_capacity_reservation_group(rg.group(1), group.name):
            used = len(r.virtual_machines_associated or [])
            out.append(Reservation(location, (r.zones or [""])[0], r.sku.name, group.name,
                                   int(r.sku.capacity or 0), used))
    return out


def _arm_client(settings: Any) -> Any:
    """A ComputeManagementClient as the Azure provider builds one (same endpoint, auth policy)."""
    from azure.mgmt.compute import ComputeManagementClient

    from providers.azure import ARM_URL, _auth_policy, _make_credential

    credential = _make_credential(settings.credentials)
    scopes = [f"{ARM_URL}/.default"]
    kwargs: dict[str, Any] = dict(base_url=settings.base_url, credential_scopes=scopes, retry_total=settings.retries,
                                  connection_timeout=settings.timeout_s, read_timeout=settings.timeout_s)
    policy = _auth_policy(credential, settings.base_url, scopes)
    if policy is not None:
        kwargs["authentication_policy"] = policy
    return ComputeManagementClient(credential, settings.subscription_id, **kwargs)


def fetch(raw: Mapping[str, Any], catalog: Any, now: float) -> Snapshot:
    from providers.azure import map_error

    settings = provider_table(AzureSettings, "azure", raw)
    url = settings.retail_prices_url
    client = _arm_client(settings)
    types = instance_types(catalog, "azure")
    regions = set(settings.regions) or {r for (p, r) in catalog.regions if p == "azure"}
    snap = Snapshot("azure", now)

    def part(kind: str, region: str, fn: Any, *args: Any) -> Any:
        return snap.part(kind, region, fn, map_error, *args) or None

    snap.prices += part("prices", "", retail_prices, url, sorted(types), regions, settings.timeout_s) or []
    families: dict[str, str] = {}
    for region in sorted(regions):
        found = part("zones", region, zones_and_families, client, region, set(types))
        if found is not None:
            snap.zones += found[0]
            families.update(found[1])
    for name, fam in sorted(families.items()):
        vcpus = float(types[name].vcpus)
        snap.needs += [QuotaNeed(name, "on_demand", fam, vcpus), QuotaNeed(name, "spot", "lowPriorityCores", vcpus)]
    wanted = set(families.values()) | {"lowPriorityCores"}
    for region in sorted(regions):
        snap.quotas += part("quotas", region, quotas_of, client, region, wanted) or []
    snap.reservations += part("reservations", "", reservations_of, client, regions) or []
    if snap.all_failed():
        raise ProviderError(f"every Azure market call failed; first: {snap.errors[0]}", provider="azure",
                            code="MarketUnavailable")
    return snap


def fetch_quotas(raw: Mapping[str, Any], catalog: Any, region: str, names: set[str]) -> list[Quota]:
    """Only ``region``'s usages named ``names``, now (after a launch met a quota error there)."""
    from providers.azure import map_error

    client = _arm_client(provider_table(AzureSettings, "azure", raw))
    try:
        return quotas_of(client, region, names)
    except AzureError as e:
        raise map_error(e, region=region) from e


class AzureMarket:
    """Azure's :class:`providers.market.MarketSource`: the Retail Prices API, resource SKUs
    (zones and quota families), usages (quotas) and capacity reservation groups. The quota an
    instance type draws on (its family) comes from the resource SKUs of a full fetch."""

    sources = ("price_list", "quotas", "reservations", "zones")

    def fetch(self, settings: Any, catalog: Any, now: float) -> Snapshot:
        return fetch(settings, catalog, now)

    def quotas(self, settings: Any, catalog: Any, region: str, known: Snapshot | None) -> list[Quota]:
        names = {n.key for n in known.needs} if known is not None else set()
        return fetch_quotas(settings, catalog, region, names | {"lowPriorityCores"})

    def needs(self, catalog: Any, known: Snapshot | None) -> list[QuotaNeed]:
        return list(known.needs) if known is not None else []


MARKET = AzureMarket()
