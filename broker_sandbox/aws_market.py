"""The AWS market APIs moto lacks, served on the mocked EC2's own loopback server.

:class:`AwsMarket` holds what a test seeds and answers, on the wire, the calls a market refresh
makes that moto does not serve (or serves with placeholders):

- Price List Query API ``AWSPriceListService.GetProducts`` (JSON 1.1): ``PriceList`` is a list of
  JSON documents *in strings*, each ``{"product": {"productFamily", "attributes": {...}, "sku"},
  "serviceCode", "terms": {"OnDemand": {"SKU.OFFER": {"priceDimensions": {"SKU.OFFER.RATE":
  {"unit": "Hrs", "pricePerUnit": {"USD": "98.3200000000"}, ...}}, "effectiveDate", ...}}},
  "publicationDate", "version"}``; ``TERM_MATCH`` filters on attributes, ``MaxResults`` /
  ``NextToken`` paging; unknown service code: ``InvalidParameterException``.
- Service Quotas ``ServiceQuotasV20190624.GetServiceQuota`` (JSON 1.1): ``{"Quota": {"ServiceCode",
  "QuotaCode", "QuotaArn", "QuotaName", "Value", "Unit", "Adjustable", "GlobalQuota"}}``; an unknown
  code: ``NoSuchResourceException`` (HTTP 400).
- EC2 ``DescribeSpotPriceHistory`` for regions a test seeded (``spotPriceHistorySet`` items with
  ``availabilityZone``, ``instanceType``, ``productDescription``, ``spotPrice``, ``timestamp``);
  unseeded regions fall through to moto, whose every spot price is ``0.00001`` — the implausible
  answer a refresh must refuse.
- EC2 ``GetSpotPlacementScores`` (``spotPlacementScoreSet`` items with ``region`` and ``score``).
- EC2 ``DescribeCapacityBlockOfferings`` (``capacityBlockOfferingSet`` items with
  ``capacityBlockOfferingId``, ``instanceType``, ``availabilityZone``, ``instanceCount``,
  ``startDate``, ``endDate``, ``capacityBlockDurationHours``, ``upfrontFee``, ``currencyCode``,
  ``tenancy``) for the blocks a test seeded: the fee is the seeded hourly rate x nodes x hours, a
  block must start inside ``StartDateRange``..``EndDateRange``; a missing ``InstanceType``,
  ``InstanceCount`` or ``CapacityDurationHours`` is ``MissingParameter``, a duration that is not
  whole days (up to 14, then whole weeks up to 182 days) ``InvalidParameterValue``. Every offering
  answered is remembered by its id (:meth:`AwsMarket.offering`) for ``PurchaseCapacityBlock``, which
  :class:`broker_sandbox.aws.AwsCloud` serves.

Zones (``DescribeInstanceTypeOfferings``) and instances come from moto itself; Capacity
Reservations from :class:`broker_sandbox.aws.AwsCloud`.
"""
from __future__ import annotations

import datetime as dt
import json
import re
import threading
import uuid
from decimal import Decimal
from typing import Any
from xml.sax.saxutils import escape

REGION_NAMES = {
    "us-east-1": "US East (N. Virginia)", "us-east-2": "US East (Ohio)", "us-west-2": "US West (Oregon)",
    "us-west-1": "US West (N. California)", "eu-west-1": "EU (Ireland)", "eu-central-1": "EU (Frankfurt)",
    "eu-north-1": "EU (Stockholm)", "ca-central-1": "Canada (Central)", "ap-northeast-1": "Asia Pacific (Tokyo)",
}
_CREDENTIAL_REGION = re.compile(r"Credential=[^/]+/\d{8}/([a-z0-9-]+)/")
PRICING_TARGET = "AWSPriceListService."
QUOTAS_TARGET = "ServiceQuotasV20190624."
_QUOTA_NAMES = {
    "L-417A185B": "Running On-Demand P instances", "L-DB2E81BA": "Running On-Demand G and VT instances",
    "L-7212CCBC": "All P Spot Instance Requests", "L-3819A6DF": "All G and VT Spot Instance Requests",
}
_EC2_ACTIONS = ("DescribeSpotPriceHistory", "GetSpotPlacementScores")


class AwsMarket:
    """Seeded market data and its wire answers (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self.products: list[dict[str, Any]] = []
            self.spot: dict[tuple[str, str], tuple[str, str]] = {}  # (zone, type) -> (price, timestamp)
            self.quotas: dict[tuple[str, str], float] = {}  # (region, code) -> value
            self.scores: dict[tuple[str, str], int] = {}  # (region, type) -> 1..10
            # Capacity Blocks on sale: (zone, type, start epoch s, USD per node-hour)
            self.blocks: list[tuple[str, str, float, str]] = []
            # Offerings answered, by id: (zone, type, start epoch s, hours, count, upfront fee "USD")
            self.offered: dict[str, tuple[str, str, float, int, int, str]] = {}
            self.calls: list[str] = []

    # -- seeding --------------------------------------------------------------------------------
    def add_on_demand(self, region: str, instance_type: str, usd_per_hour: str,
                      effective: str = "2026-11-01T00:00:00Z", **attributes: str) -> None:
        """One EC2 product (Linux, shared tenancy, capacity status Used unless overridden)."""
        sku = uuid.uuid4().hex[:16].upper()
        attrs = {"servicecode": "AmazonEC2", "location": REGION_NAMES.get(region, region),
                 "locationType": "AWS Region", "regionCode": region, "instanceType": instance_type,
                 "instanceFamily": "GPU instance", "operatingSystem": "Linux", "tenancy": "Shared",
                 "preInstalledSw": "NA", "capacitystatus": "Used", "licenseModel": "No License required",
                 "usagetype": f"BoxUsage:{instance_type}", "operation": "RunInstances", **attributes}
        offer, rate = "JRTCKXETXF", "6YS6EN2CT7"
        doc = {
            "product": {"productFamily": "Compute Instance", "attributes": attrs, "sku": sku},
            "serviceCode": "AmazonEC2",
            "terms": {"OnDemand": {f"{sku}.{offer}": {
                "priceDimensions": {f"{sku}.{offer}.{rate}": {
                    "unit": "Hrs", "endRange": "Inf", "beginRange": "0", "appliesTo": [],
                    "rateCode": f"{sku}.{offer}.{rate}",
                    "description": f"${usd_per_hour} per On Demand Linux {instance_type} Instance Hour",
                    "pricePerUnit": {"USD": f"{Decimal(usd_per_hour):.10f}"}}},
                "sku": sku, "effectiveDate": effective, "offerTermCode": offer, "termAttributes": {}}}},
            "version": "20261101000000", "publicationDate": effective,
        }
        with self._lock:
            self.products.append(doc)

    def add_spot(self, zone: str, instance_type: str, usd_per_hour: str,
                 timestamp: str = "2026-12-01T12:00:00.000Z") -> None:
        with self._lock:
            self.spot[(zone, instance_type)] = (f"{Decimal(usd_per_hour):.6f}", timestamp)

    def set_quota(self, region: str, code: str, value: float) -> None:
        with self._lock:
            self.quotas[(region, code)] = value

    def add_capacity_block(self, zone: str, instance_type: str, start: float, usd_per_node_hour: str) -> None:
        """A Capacity Block on sale in ``zone`` from ``start`` (epoch seconds), any size and length."""
        with self._lock:
            self.blocks.append((zone, instance_type, start, usd_per_node_hour))

    def offering(self, offering_id: str) -> tuple[str, str, float, int, int, str] | None:
        """A Capacity Block offering answered earlier: (zone, type, start, hours, count, fee)."""
        with self._lock:
            return self.offered.get(offering_id)

    def set_score(self, region: str, instance_type: str, score: int) -> None:
        with self._lock:
            self.scores[(region, instance_type)] = score

    # -- wire -----------------------------------------------------------------------------------
    @staticmethod
    def region_of(environ: dict) -> str:
        m = _CREDENTIAL_REGION.search(environ.get("HTTP_AUTHORIZATION", ""))
        return m.group(1) if m else "us-east-1"

    def handles_json(self, environ: dict) -> bool:
        target = environ.get("HTTP_X_AMZ_TARGET", "")
        return target.startswith((PRICING_TARGET, QUOTAS_TARGET))

    def json_call(self, environ: dict, body: bytes) -> tuple[int, list, bytes]:
        target = environ.get("HTTP_X_AMZ_TARGET", "")
        region = self.region_of(environ)
        with self._lock:
            self.calls.append(target)
        try:
            req = json.loads(body or b"{}")
        except ValueError:
            return _json_error("SerializationException", "Malformed JSON body")
        if target == PRICING_TARGET + "GetProducts":
            return self._get_products(req)
        if target == QUOTAS_TARGET + "GetServiceQuota":
            return self._get_service_quota(region, req)
        return _json_error("UnknownOperationException", f"Unknown operation {target}")

    def _get_products(self, req: dict) -> tuple[int, list, bytes]:
        if req.get("ServiceCode") != "AmazonEC2":
            return _json_error("InvalidParameterException",
                               f"Input parameters ServiceCode are invalid: {req.get('ServiceCode')!r}")
        filters = req.get("Filters") or []
        for f in filters:
            if f.get("Type") not in ("TERM_MATCH", "EQUALS", "CONTAINS", "ANY_OF", "NONE_OF"):
                return _json_error("InvalidParameterException", f"Invalid filter type {f.get('Type')}")
        with self._lock:
            docs = [d for d in self.products
                    if all(_matches(d["product"]["attributes"].get(f["Field"]), f) for f in filters)]
        size = int(req.get("MaxResults") or 100)
        start = int(req.get("NextToken") or 0)
        page = docs[start:start + size]
        out: dict[str, Any] = {"FormatVersion": "aws_v1", "PriceList": [json.dumps(d) for d in page]}
        if start + size < len(docs):
            out["NextToken"] = str(start + size)
        return 200, [("Content-Type", "application/x-amz-json-1.1")], json.dumps(out).encode()

    def _get_service_quota(self, region: str, req: dict) -> tuple[int, list, bytes]:
        code, service = req.get("QuotaCode", ""), req.get("ServiceCode", "")
        with self._lock:
            value = self.quotas.get((region, code))
        if service != "ec2" or value is None:
            return _json_error("NoSuchResourceException",
                               f"The request failed because the specified quota {code} does not exist.")
        quota = {"ServiceCode": "ec2", "ServiceName": "Amazon Elastic Compute Cloud (Amazon EC2)",
                 "QuotaArn": f"arn:aws:servicequotas:{region}:123456789012:ec2/{code}",
                 "QuotaCode": code, "QuotaName": _QUOTA_NAMES.get(code, code), "Value": value,
                 "Unit": "None", "Adjustable": True, "GlobalQuota": False}
        return 200, [("Content-Type", "application/x-amz-json-1.1")], json.dumps({"Quota": quota}).encode()

    def handles_query(self, action: str, region: str) -> bool:
        if action in ("GetSpotPlacementScores", "DescribeCapacityBlockOfferings"):
            return True
        if action == "DescribeSpotPriceHistory":
            with self._lock:
                return any(z.startswith(region) for z, _ in self.spot)
        return False

    def query_call(self, action: str, region: str, p: dict[str, str]) -> tuple[int, list, bytes]:
        with self._lock:
            self.calls.append(action)
        if action == "DescribeCapacityBlockOfferings":
            return self._capacity_blocks(region, p)
        if action == "DescribeSpotPriceHistory":
            types = set(_indexed(p, "InstanceType"))
            products = set(_indexed(p, "ProductDescription"))
            with self._lock:
                rows = [(z, t, price, ts) for (z, t), (price, ts) in sorted(self.spot.items())
                        if z.startswith(region) and (not types or t in types)
                        and (not products or "Linux/UNIX" in products)]
            items = "".join(
                f"<item><instanceType>{escape(t)}</instanceType><productDescription>Linux/UNIX"
                f"</productDescription><spotPrice>{price}</spotPrice><timestamp>{ts}</timestamp>"
                f"<availabilityZone>{z}</availabilityZone></item>" for z, t, price, ts in rows)
            return 200, [("Content-Type", "text/xml")], _xml(
                action, f"<spotPriceHistorySet>{items}</spotPriceHistorySet><nextToken/>")
        types = _indexed(p, "InstanceType")
        regions = _indexed(p, "RegionName")
        if not p.get("TargetCapacity"):
            return 400, [("Content-Type", "text/xml")], _error(
                "MissingParameter", "The request must contain the parameter TargetCapacity")
        with self._lock:
            scores = {r: min((self.scores.get((r, t), 5) for t in types), default=5) for r in regions}
        items = "".join(f"<item><region>{r}</region><score>{s}</score></item>" for r, s in scores.items())
        return 200, [("Content-Type", "text/xml")], _xml(
            action, f"<spotPlacementScoreSet>{items}</spotPlacementScoreSet>")


    def _capacity_blocks(self, region: str, p: dict[str, str]) -> tuple[int, list, bytes]:
        xml = [("Content-Type", "text/xml")]
        for name in ("InstanceType", "InstanceCount", "CapacityDurationHours"):
            if not p.get(name):
                return 400, xml, _error("MissingParameter", f"The request must contain the parameter {name}")
        hours, count = int(p["CapacityDurationHours"]), int(p["InstanceCount"])
        days, rest = divmod(hours, 24)
        if rest or not (1 <= days <= 14 or (days <= 182 and days % 7 == 0)) or not 1 <= count <= 64:
            return 400, xml, _error("InvalidParameterValue",
                                    f"The value ({hours}) for parameter CapacityDurationHours is invalid.")
        lo, hi = _when(p.get("StartDateRange")), _when(p.get("EndDateRange"))
        with self._lock:
            rows = [b for b in self.blocks if b[0].startswith(region) and b[1] == p["InstanceType"]
                    and (lo is None or b[2] >= lo) and (hi is None or b[2] + hours * 3600 <= hi)]
        items = []
        for z, t, start, rate in rows:
            oid = f"cb-{uuid.uuid5(uuid.NAMESPACE_URL, f'{z}/{t}/{start}/{hours}/{count}').hex[:17]}"
            fee = f"{Decimal(rate) * count * hours:.2f}"
            with self._lock:
                self.offered[oid] = (z, t, start, hours, count, fee)
            items.append(
                f"<item><capacityBlockOfferingId>{oid}</capacityBlockOfferingId><instanceType>{escape(t)}"
                f"</instanceType><availabilityZone>{z}</availabilityZone><instanceCount>{count}</instanceCount>"
                f"<startDate>{_iso(start)}</startDate><endDate>{_iso(start + hours * 3600)}</endDate>"
                f"<capacityBlockDurationHours>{hours}</capacityBlockDurationHours><upfrontFee>{fee}</upfrontFee>"
                f"<currencyCode>USD</currencyCode><tenancy>default</tenancy></item>")
        return 200, xml, _xml("DescribeCapacityBlockOfferings",
                              f"<capacityBlockOfferingSet>{''.join(items)}</capacityBlockOfferingSet>")


def _when(text: str | None) -> float | None:
    if not text:
        return None
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def _matches(value: Any, f: dict) -> bool:
    want, kind = f.get("Value", ""), f.get("Type")
    if value is None:
        return False
    if kind in ("TERM_MATCH", "EQUALS"):
        return str(value).lower() == str(want).lower()
    if kind == "CONTAINS":
        return str(want).lower() in str(value).lower()
    options = [v.strip().lower() for v in str(want).split(",")]
    return (str(value).lower() in options) == (kind == "ANY_OF")


def _indexed(params: dict[str, str], prefix: str) -> list[str]:
    out, n = [], 1
    while f"{prefix}.{n}" in params:
        out.append(params[f"{prefix}.{n}"])
        n += 1
    return out


def _xml(action: str, inner: str) -> bytes:
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<{action}Response '
            f'xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"><requestId>{uuid.uuid4()}</requestId>'
            f"{inner}</{action}Response>").encode()


def _error(code: str, message: str) -> bytes:
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>{code}</Code>'
            f"<Message>{escape(message)}</Message></Error></Errors><RequestID>{uuid.uuid4()}"
            f"</RequestID></Response>").encode()


def _json_error(code: str, message: str, status: int = 400) -> tuple[int, list, bytes]:
    body = json.dumps({"__type": code, "Message": message}).encode()
    return status, [("Content-Type", "application/x-amz-json-1.1"), ("x-amzn-ErrorType", code)], body


def now_rfc3339() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")
