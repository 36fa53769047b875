"""AWS market data through boto3: Price List Query API, spot price history, zones, quotas,
Capacity Reservations and spot placement scores.

Endpoints follow boto3's own resolution: a service-specific setting (``AWS_ENDPOINT_URL_PRICING``,
``AWS_ENDPOINT_URL_EC2``, ``AWS_ENDPOINT_URL_SERVICE_QUOTAS`` or the shared config file's
``services`` section) wins; otherwise ``[providers.aws] endpoint_url`` applies to every service.

- on-demand: ``pricing.get_products`` (``AmazonEC2``, Linux, shared tenancy, no pre-installed
  software, capacity status ``Used``), one query per instance type for every region at once; each
  ``PriceList`` entry is a JSON document in a string.
- spot: ``ec2.describe_spot_price_history`` (Linux/UNIX, the latest price of every zone).
- zones: ``ec2.describe_instance_type_offerings`` by availability zone.
- quotas: ``service-quotas.get_service_quota`` for the P and G/VT on-demand and spot vCPU quotas,
  minus the vCPUs of the account's running instances of that bucket.
- reservations: ``ec2.describe_capacity_reservations`` (active ones: total and available).
- spot risk: ``ec2.get_spot_placement_scores`` per instance type over the configured regions.
- queued capacity: ``ec2.describe_capacity_block_offerings`` per P-family instance type (one node
  for :data:`BLOCK_HOURS` hours, starting within :data:`BLOCK_LOOKAHEAD_DAYS` days): the blocks on
  sale, each with its start, end and up-front fee.

IAM actions: ``pricing:GetProducts``, ``ec2:DescribeSpotPriceHistory``,
``ec2:DescribeInstanceTypeOfferings``, ``servicequotas:GetServiceQuota``,
``ec2:DescribeInstances``, ``ec2:DescribeCapacityReservations``, ``ec2:GetSpotPlacementScores``,
``ec2:DescribeCapacityBlockOfferings``.
"""
from __future__ import annotations

import json
import os
from decimal import Decimal
from typing import Any, Iterable, Mapping

import botocore.exceptions as bce
from botocore.config import Config

from providers.aws.client import _session
from providers.aws.errors import map_error
from providers.aws.errors import AWS_ERRORS
from providers.base import MICROS, ProviderError
from providers.aws.settings import AwsSettings
from providers.settings import provider_table
from providers.market import (CapacityBlock, LivePrice, Quota, QuotaNeed, Reservation, Snapshot, SpotSignal, Zones,
                              instance_types, rfc3339)

PRICING_REGION = "us-east-1"  # the Price List Query API answers in us-east-1, eu-central-1, ap-south-1
# (bucket, market) -> (Service Quotas code, label). Values are vCPUs.
QUOTA_CODES = {
    ("P", "on_demand"): ("L-417A185B", "P on-demand vCPUs"),
    ("G", "on_demand"): ("L-DB2E81BA", "G and VT on-demand vCPUs"),
    ("P", "spot"): ("L-7212CCBC", "P spot vCPUs"),
    ("G", "spot"): ("L-3819A6DF", "G and VT spot vCPUs"),
}
# Capacity Blocks asked for: one node for a day (the shortest block), starting in the next weeks.
BLOCK_HOURS = 24
BLOCK_LOOKAHEAD_DAYS = 56
_PRODUCT_FILTERS = (("operatingSystem", "Linux"), ("tenancy", "Shared"), ("preInstalledSw", "NA"),
                    ("capacitystatus", "Used"))


def bucket(instance_type: str) -> str:
    """The vCPU quota bucket of an instance type: ``P`` (p4d, p5, ...) or ``G`` (g5, g6e, ...)."""
    return "P" if instance_type[:1].lower() == "p" else "G"


class _Clients:
    def __init__(self, settings: AwsSettings) -> None:
        self.settings = settings
        self.session = _session(settings.anonymous)
        self.config = Config(connect_timeout=settings.connect_timeout_s, read_timeout=settings.read_timeout_s,
                             retries={"mode": "standard", "total_max_attempts": 3},
                             user_agent_extra="gpu-burst-broker")
        self._made: dict[tuple[str, str], Any] = {}

    def __call__(self, service: str, region: str) -> Any:
        key = (service, region)
        if key not in self._made:
            env = "AWS_ENDPOINT_URL_" + service.upper().replace("-", "_")
            # An explicit endpoint_url would override boto3's per-service settings; pass ours only
            # when none is set for this service.
            endpoint = None if os.environ.get(env) else (self.settings.endpoint_url or None)
            self._made[key] = self.session.client(service, region_name=region, config=self.config,
                                                  endpoint_url=endpoint)
        return self._made[key]


def _micros(text: str) -> int:
    return int((Decimal(text) * MICROS).to_integral_value())


def on_demand_prices(pricing: Any, types: Iterable[str], regions: set[str]) -> list[LivePrice]:
    out: list[LivePrice] = []
    for it in types:
        filters = [{"Type": "TERM_MATCH", "Field": "instanceType", "Value": it}]
        filters += [{"Type": "TERM_MATCH", "Field": f, "Value": v} for f, v in _PRODUCT_FILTERS]
        pages = pricing.get_paginator("get_products").paginate(
            ServiceCode="AmazonEC2", Filters=filters, FormatVersion="aws_v1")
        for page in pages:
            for doc in page.get("PriceList", []):
                item = json.loads(doc) if isinstance(doc, str) else doc
                price = _on_demand_of(item)
                attrs = (item.get("product") or {}).get("attributes") or {}
                region = attrs.get("regionCode", "")
                if price is None or region not in regions or attrs.get("instanceType") != it:
                    continue
                out.append(LivePrice(region, it, "on_demand", price[0], "aws:pricing", price[1]))
    return out


def _on_demand_of(item: Mapping[str, Any]) -> tuple[int, str] | None:
    """The hourly USD price and its effective date from one Price List product document."""
    for term in ((item.get("terms") or {}).get("OnDemand") or {}).values():
        for dim in (term.get("priceDimensions") or {}).values():
            usd = (dim.get("pricePerUnit") or {}).get("USD")
            if usd is not None and dim.get("unit", "Hrs") in ("Hrs", "Hours"):
                return _micros(usd), str(term.get("effectiveDate", ""))
    return None


def spot_prices(ec2: Any, region: str, types: list[str]) -> list[LivePrice]:
    latest: dict[tuple[str, str], dict] = {}
    pages = ec2.get_paginator("describe_spot_price_history").paginate(
        InstanceTypes=types, ProductDescriptions=["Linux/UNIX"])
    for page in pages:
        for row in page.get("SpotPriceHistory", []):
            key = (row["AvailabilityZone"], row["InstanceType"])
            if key not in latest or row["Timestamp"] > latest[key]["Timestamp"]:
                latest[key] = row
    return [LivePrice(region, t, "spot", _micros(r["SpotPrice"]), "aws:spot_price_history",
                      r["Timestamp"].strftime("%Y-%m-%dT%H:%M:%SZ"), zone=z)
            for (z, t), r in sorted(latest.items())]


def zones_of(ec2: Any, region: str, types: list[str]) -> list[Zones]:
    found: dict[str, set[str]] = {}
    pages = ec2.get_paginator("describe_instance_type_offerings").paginate(
        LocationType="availability-zone", Filters=[{"Name": "instance-type", "Values": types}])
    for page in pages:
        for row in page.get("InstanceTypeOfferings", []):
            found.setdefault(row["InstanceType"], set()).add(row["Location"])
    return [Zones(region, t, tuple(sorted(z))) for t, z in sorted(found.items())]


def quotas_of(quotas: Any, ec2: Any, region: str, vcpus: Mapping[str, int]) -> list[Quota]:
    running: dict[tuple[str, str], int] = {}
    pages = ec2.get_paginator("describe_instances").paginate(
        Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}])
    for page in pages:
        for res in page.get("Reservations", []):
            for inst in res.get("Instances", []):
                t = inst.get("InstanceType", "")
                market = "spot" if inst.get("InstanceLifecycle") == "spot" else "on_demand"
                n = vcpus.get(t) or (inst.get("CpuOptions") or {}).get("CoreCount", 0) * \
                    (inst.get("CpuOptions") or {}).get("ThreadsPerCore", 1)
                running[(bucket(t), market)] = running.get((bucket(t), market), 0) + int(n)
    out = []
    for (b, market), (code, label) in QUOTA_CODES.items():
        try:
            q = quotas.get_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]
        except bce.ClientError as e:
            if e.response.get("Error", {}).get("Code") == "NoSuchResourceException":
                continue  # the quota does not exist in this region
            raise
        out.append(Quota(region, code, label, float(q["Value"]), float(running.get((b, market), 0))))
    return out


def reservations_of(ec2: Any, region: str) -> list[Reservation]:
    out = []
    pages = ec2.get_paginator("describe_capacity_reservations").paginate(
        Filters=[{"Name": "state", "Values": ["active"]}])
    for page in pages:
        for r in page.get("CapacityReservations", []):
            total = int(r.get("TotalInstanceCount", 0))
            out.append(Reservation(region, r.get("AvailabilityZone", ""), r["InstanceType"],
                                   r["CapacityReservationId"], total,
                                   total - int(r.get("AvailableInstanceCount", 0))))
    return out


def placement_scores(ec2: Any, types: list[str], regions: list[str]) -> list[SpotSignal]:
    out = []
    for t in types:
        pages = ec2.get_paginator("get_spot_placement_scores").paginate(
            InstanceTypes=[t], TargetCapacity=1, TargetCapacityUnitType="units",
            SingleAvailabilityZone=False, RegionNames=regions)
        for page in pages:
            for s in page.get("SpotPlacementScores", []):
                out.append(SpotSignal(s["Region"], t, float(s["Score"]), "aws:spot_placement_score"))
    return out


def capacity_blocks(ec2: Any, region: str, types: list[str], now: float) -> list[CapacityBlock]:
    """The Capacity Block offerings on sale in ``region`` for the P-family ``types`` (GPU blocks):
    one node for :data:`BLOCK_HOURS` hours, each offering with its start and up-front fee."""
    import datetime as dt

    start = dt.datetime.fromtimestamp(now, dt.timezone.utc)
    out = []
    for t in (t for t in types if bucket(t) == "P"):
        pages = ec2.get_paginator("describe_capacity_block_offerings").paginate(
            InstanceType=t, InstanceCount=1, CapacityDurationHours=BLOCK_HOURS, StartDateRange=start,
            EndDateRange=start + dt.timedelta(days=BLOCK_LOOKAHEAD_DAYS))
        for page in pages:
            for b in page.get("CapacityBlockOfferings", []):
                if b.get("CurrencyCode", "USD") != "USD":
                    continue  # money is USD micro-dollars throughout
                out.append(CapacityBlock(
                    region, b.get("AvailabilityZone", ""), b.get("InstanceType", t), b["CapacityBlockOfferingId"],
                    int(b.get("InstanceCount", 1)), b["StartDate"].strftime("%Y-%m-%dT%H:%M:%SZ"),
                    b["EndDate"].strftime("%Y-%m-%dT%H:%M:%SZ"),
                    float(b.get("CapacityBlockDurationHours", BLOCK_HOURS)), _micros(b["UpfrontFee"]), "USD"))
    return out


def needs_of(catalog: Any) -> list[QuotaNeed]:
    """The vCPU quota each instance type draws on, per market."""
    return [QuotaNeed(n, m, QUOTA_CODES[(bucket(n), m)][0], float(it.vcpus))
            for n, it in sorted(instance_types(catalog, "aws").items()) for m in ("on_demand", "spot") if it.vcpus]


def fetch(raw: Mapping[str, Any], catalog: Any, now: float) -> Snapshot:
    settings: AwsSettings = provider_table(AwsSettings, "aws", raw)
    client = _Clients(settings)
    types = instance_types(catalog, "aws")
    names = sorted(types)
    vcpus = {n: it.vcpus for n, it in types.items()}
    snap = Snapshot("aws", now)
    snap.needs = needs_of(catalog)

    def part(kind: str, region: str, fn: Any, *args: Any) -> list:
        return snap.part(kind, region, fn, map_error, *args)

    snap.prices += part("prices", "", on_demand_prices, client("pricing", PRICING_REGION), names,
                        set(settings.regions))
    for region in settings.regions:
        ec2 = client("ec2", region)
        spot = part("spot_prices", region, spot_prices, ec2, region, names)
        snap.prices += spot
        if ("spot_prices", region) in snap.failed:
            snap.failed.append(("prices", region))
        snap.zones += part("zones", region, zones_of, ec2, region, names)
        snap.quotas += part("quotas", region, quotas_of, client("service-quotas", region), ec2, region, vcpus)
        snap.reservations += part("reservations", region, reservations_of, ec2, region)
        snap.blocks += part("blocks", region, capacity_blocks, ec2, region, names, now)
    snap.spot += part("spot", "", placement_scores, client("ec2", settings.regions[0]), names,
                      list(settings.regions))
    if snap.all_failed():
        raise ProviderError(f"every AWS market call failed; first: {snap.errors[0]}", provider="aws",
                            code="MarketUnavailable")
    return snap


__all__ = ["fetch", "bucket", "QUOTA_CODES", "rfc3339"]


def fetch_quotas(raw: Mapping[str, Any], catalog: Any, region: str) -> list[Quota]:
    """Only ``region``'s quotas, now (after a launch met a quota error there)."""
    settings: AwsSettings = provider_table(AwsSettings, "aws", raw)
    client = _Clients(settings)
    vcpus = {n: it.vcpus for n, it in instance_types(catalog, "aws").items()}
    try:
        return quotas_of(client("service-quotas", region), client("ec2", region), region, vcpus)
    except AWS_ERRORS as e:
        raise map_error(e, region=region) from e


class AwsMarket:
    """AWS's :class:`providers.market.MarketSource`: the Price List API, spot price history,
    spot placement scores, Service Quotas, capacity reservations and zone offerings."""

    sources = ("price_list", "spot_history", "placement_scores", "quotas", "reservations", "zones",
               "capacity_blocks")

    def fetch(self, settings: Any, catalog: Any, now: float) -> Snapshot:
        return fetch(settings, catalog, now)

    def quotas(self, settings: Any, catalog: Any, region: str, known: Snapshot | None) -> list[Quota]:
        return fetch_quotas(settings, catalog, region)

    def needs(self, catalog: Any, known: Snapshot | None) -> list[QuotaNeed]:
        return needs_of(catalog)


MARKET = AwsMarket()
