"""GCP market data: the Cloud Billing Catalog API for prices, Compute Engine for zones, quotas
and reservations.

- prices: ``google-cloud-billing`` ``CloudCatalogClient.list_skus`` for Compute Engine (service
  ``6F81-5844-456A``), REST transport, endpoint ``[providers.gcp] billing_api_endpoint`` (default
  the public one). A machine's hourly price is its parts: GPUs x the GPU SKU + vCPUs x the family's
  core SKU + GiB x its RAM SKU, each the tier that starts at 0, in ``units + nanos``; spot uses
  the ``Spot Preemptible`` SKUs. A machine any of whose parts has no SKU in a region gets no live
  price there (the bundled one stays).
- zones: ``machineTypes.aggregatedList`` (GPU machine families) and
  ``acceleratorTypes.aggregatedList`` (N1 + attached GPUs).
- quotas: ``regions.get`` quotas ``NVIDIA_<GPU>_GPUS`` and ``PREEMPTIBLE_NVIDIA_<GPU>_GPUS``
  (limit and usage, in GPUs).
- reservations: ``reservations.aggregatedList`` (count and inUseCount of specific reservations).
"""
from __future__ import annotations

import re
from typing import Any, Mapping

from google.api_core import exceptions as gexc
from google.api_core.client_options import ClientOptions

from providers.base import ProviderError
from providers.gcp.settings import GcpSettings
from providers.settings import is_loopback_url, provider_table
from providers.gcp.credentials import load_credentials
from providers.gcp.errors import map_error
from providers.gcp.sdk import compute_v1
from providers.market import LivePrice, Quota, QuotaNeed, Reservation, Snapshot, Zones, instance_types

COMPUTE_SERVICE = "services/6F81-5844-456A"
# (GPU model, GB per GPU) -> the GPU's name in billing SKU descriptions and its quota metric.
GPUS: dict[tuple[str, int], tuple[str, str]] = {
    ("H100", 80): ("nvidia h100 80gb gpu", "NVIDIA_H100_GPUS"),
    ("H200", 141): ("nvidia h200 141gb gpu", "NVIDIA_H200_GPUS"),
    ("A100", 40): ("nvidia a100 gpu", "NVIDIA_A100_GPUS"),
    ("A100", 80): ("nvidia a100 80gb gpu", "NVIDIA_A100_80GB_GPUS"),
    ("L4", 24): ("nvidia l4 gpu", "NVIDIA_L4_GPUS"),
    ("T4", 16): ("nvidia t4 gpu", "NVIDIA_T4_GPUS"),
    ("V100", 16): ("nvidia v100 gpu", "NVIDIA_V100_GPUS"),
}
_MEGA = ("nvidia h100 80gb mega gpu", "NVIDIA_H100_MEGA_GPUS")
_RUNNING_IN = re.compile(r"\s+running in\s+.*$", re.I)


def gpu_names(it: Any) -> tuple[str, str] | None:
    """(billing name, quota metric) of an instance type's GPU."""
    if "megagpu" in it.sdk_machine_type:
        return _MEGA
    return GPUS.get((it.gpu.upper(), it.gpu_memory_gb))


def sku_key(description: str) -> tuple[str, bool]:
    """A SKU description normalised to the part it prices, and whether it is the spot price:
    ``"Spot Preemptible Nvidia Tesla T4 GPU running in Americas"`` -> ``("nvidia t4 gpu", True)``."""
    d = _RUNNING_IN.sub("", description.strip()).lower()
    spot = d.startswith(("spot preemptible ", "preemptible "))
    d = d.removeprefix("spot preemptible ").removeprefix("preemptible ").replace("tesla ", "")
    return d, spot


def _rate(pricing_info: Any) -> tuple[float, str] | None:
    """USD per unit of the tier starting at 0 of the newest pricing, and its effective time."""
    if not pricing_info:
        return None
    info = pricing_info[0]
    expr = info.pricing_expression
    base = [t for t in expr.tiered_rates if float(t.start_usage_amount) == 0.0]
    if not base:
        return None
    price = base[-1].unit_price
    usd = int(price.units) + price.nanos / 1e9
    when = info.effective_time
    return usd / float(expr.display_quantity or 1), when.isoformat() if hasattr(when, "isoformat") else str(when)


def parts_of(it: Any) -> list[tuple[str, float]]:
    """(SKU name, quantity) of the parts one node is billed for."""
    family = it.sdk_machine_type.split("-")[0].upper()
    core = "n1 predefined instance core" if family == "N1" else f"{family.lower()} instance core"
    ram = "n1 predefined instance ram" if family == "N1" else f"{family.lower()} instance ram"
    names = gpu_names(it)
    if names is None:
        return []
    return [(names[0], float(it.gpus)), (core, float(it.vcpus)), (ram, float(it.ram_gb))]


def prices_from_skus(skus: Any, types: Mapping[str, Any], regions: set[str]) -> list[LivePrice]:
    rates: dict[tuple[str, bool, str], tuple[float, str]] = {}
    for sku in skus:
        if sku.category.resource_family != "Compute":
            continue
        name, spot = sku_key(sku.description)
        rate = _rate(sku.pricing_info)
        if rate is None:
            continue
        for region in sku.service_regions:
            if region in regions:
                rates[(name, spot, region)] = rate
    out = []
    for tname, it in sorted(types.items()):
        parts = parts_of(it)
        if not parts:
            continue
        for region in sorted(regions):
            for spot in (False, True):
                found = [rates.get((p, spot, region)) for p, _ in parts]
                if any(f is None for f in found):
                    continue
                usd = sum(f[0] * q for f, (_p, q) in zip(found, parts))  # type: ignore[index]
                as_of = max(f[1] for f in found)  # type: ignore[index]
                out.append(LivePrice(region, tname, "spot" if spot else "on_demand", int(round(usd * 1e6)),
                                     "gcp:billing_catalog", as_of))
    return out


def _zone_region(scope: str) -> tuple[str, str]:
    zone = scope.rsplit("/", 1)[-1]
    return zone, zone.rsplit("-", 1)[0]


def zones_of(machine_types: Any, accelerators: Any, project: str, types: Mapping[str, Any],
             regions: set[str]) -> list[Zones]:
    builtin = sorted({it.sdk_machine_type for it in types.values() if not it.accelerator_type})
    attached = {it.accelerator_type for it in types.values() if it.accelerator_type}
    sold: dict[tuple[str, str], set[str]] = {}  # (region, machine or accelerator type) -> zones
    if builtin:
        flt = " OR ".join(f'(name = "{m}")' for m in builtin)
        for scope, listed in machine_types.aggregated_list(request={"project": project, "filter": flt}):
            zone, region = _zone_region(scope)
            for mt in listed.machine_types:
                sold.setdefault((region, mt.name), set()).add(zone)
    if attached:
        for scope, listed in accelerators.aggregated_list(project=project):
            zone, region = _zone_region(scope)
            for at in listed.accelerator_types:
                if at.name in attached:
                    sold.setdefault((region, at.name), set()).add(zone)
    out = []
    for name, it in sorted(types.items()):
        key = it.accelerator_type or it.sdk_machine_type
        for region in sorted(regions):
            zones = sold.get((region, key))
            if zones:
                out.append(Zones(region, name, tuple(sorted(zones))))
    return out


def quotas_of(regions_client: Any, project: str, region: str, metrics: Mapping[str, str]) -> list[Quota]:
    reg = regions_client.get(project=project, region=region)
    return [Quota(region, q.metric, metrics[q.metric], float(q.limit), float(q.usage))
            for q in reg.quotas if q.metric in metrics]


def reservations_of(client: Any, project: str, types: Mapping[str, Any], regions: set[str]) -> list[Reservation]:
    by_shape = {(it.sdk_machine_type, it.accelerator_type, it.gpus if it.accelerator_type else 0): name
                for name, it in types.items()}
    out = []
    for scope, listed in client.aggregated_list(project=project):
        zone, region = _zone_region(scope)
        if region not in regions:
            continue
        for r in listed.reservations:
            spec = r.specific_reservation
            props = spec.instance_properties
            accel = props.guest_accelerators[0] if props.guest_accelerators else None
            key = (props.machine_type, accel.accelerator_type if accel else "",
                   accel.accelerator_count if accel else 0)
            name = by_shape.get(key)
            if name is not None:
                out.append(Reservation(region, zone, name, r.name, int(spec.count), int(spec.in_use_count)))
    return out


def metrics_of(catalog: Any) -> dict[str, str]:
    """The GPU quota metrics of the catalog's GCP types and their labels."""
    out: dict[str, str] = {}
    for it in instance_types(catalog, "gcp").values():
        names = gpu_names(it)
        if names is not None:
            out[names[1]] = f"{it.gpu} GPUs"
            out["PREEMPTIBLE_" + names[1]] = f"spot {it.gpu} GPUs"
    return out


def needs_of(catalog: Any) -> list[QuotaNeed]:
    """The GPU quota each instance type draws on, per market (GPUs per node)."""
    out = []
    for name, it in sorted(instance_types(catalog, "gcp").items()):
        names = gpu_names(it)
        if names is not None:
            out.append(QuotaNeed(name, "on_demand", names[1], float(it.gpus)))
            out.append(QuotaNeed(name, "spot", "PREEMPTIBLE_" + names[1], float(it.gpus)))
    return out


def fetch(raw: Mapping[str, Any], catalog: Any, now: float) -> Snapshot:
    from google.cloud import billing_v1

    settings = provider_table(GcpSettings, "gcp", raw)
    billing_endpoint = settings.billing_api_endpoint
    if settings.credentials == "anonymous" and not (billing_endpoint and is_loopback_url(billing_endpoint)):
        raise ValueError("providers.gcp.credentials = \"anonymous\" is only accepted with "
                         "providers.gcp.billing_api_endpoint on a loopback address")
    creds = load_credentials(settings)
    options = ClientOptions(api_endpoint=settings.api_endpoint) if settings.api_endpoint else None
    types = instance_types(catalog, "gcp")
    regions = set(settings.regions)
    project = settings.project
    snap = Snapshot("gcp", now)
    metrics = metrics_of(catalog)
    snap.needs = needs_of(catalog)

    def part(kind: str, region: str, fn: Any, *args: Any) -> list:
        return snap.part(kind, region, fn, map_error, *args)

    def billing_prices() -> list[LivePrice]:
        billing = billing_v1.CloudCatalogClient(
            credentials=creds, transport="rest",
            client_options=ClientOptions(api_endpoint=billing_endpoint) if billing_endpoint else None)
        skus = billing.list_skus(request={"parent": COMPUTE_SERVICE, "currency_code": "USD", "page_size": 5000})
        return prices_from_skus(skus, types, regions)

    kw = dict(credentials=creds, transport="rest", client_options=options)
    snap.prices += part("prices", "", billing_prices)
    snap.zones += part("zones", "", zones_of, compute_v1.MachineTypesClient(**kw),
                       compute_v1.AcceleratorTypesClient(**kw), project, types, regions)
    regions_client = compute_v1.RegionsClient(**kw)
    for region in settings.regions:
        snap.quotas += part("quotas", region, quotas_of, regions_client, project, region, metrics)
    snap.reservations += part("reservations", "", reservations_of, compute_v1.ReservationsClient(**kw),
                              project, types, regions)
    if snap.all_failed():
        raise ProviderError(f"every GCP market call failed; first: {snap.errors[0]}", provider="gcp",
                            code="MarketUnavailable")
    return snap


__all__ = ["fetch", "sku_key", "prices_from_skus", "is_loopback_url"]


def fetch_quotas(raw: Mapping[str, Any], catalog: Any, region: str) -> list[Quota]:
    """Only ``region``'s GPU quotas, now (after a launch met a quota error there)."""

    settings = provider_table(GcpSettings, "gcp", raw)
    options = ClientOptions(api_endpoint=settings.api_endpoint) if settings.api_endpoint else None
    metrics = metrics_of(catalog)
    client = compute_v1.RegionsClient(credentials=load_credentials(settings), transport="rest", client_options=options)
    try:
        return quotas_of(client, settings.project, region, metrics)
    except gexc.GoogleAPIError as e:
        raise map_error(e, region=region) from e


class GcpMarket:
    """Google Cloud's :class:`providers.market.MarketSource`: the Cloud Billing Catalog, machine
    type and accelerator zones, regional quotas and reservations."""

    sources = ("price_list", "quotas", "reservations", "zones")

    def fetch(self, settings: Any, catalog: Any, now: float) -> Snapshot:
        return fetch(settings, catalog, now)

    def quotas(self, settings: Any, catalog: Any, region: str, known: Snapshot | None) -> list[Quota]:
        return fetch_quotas(settings, catalog, region)

    def needs(self, catalog: Any, known: Snapshot | None) -> list[QuotaNeed]:
        return needs_of(catalog)


MARKET = GcpMarket()
