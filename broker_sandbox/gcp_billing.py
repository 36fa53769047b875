"""A fake Cloud Billing Catalog API (``cloudbilling.googleapis.com/v1``) on loopback.

It serves ``GET /v1/services`` and ``GET /v1/services/{service}/skus`` in the REST shape that
``google-cloud-billing``'s ``CloudCatalogClient`` (REST transport) reads: ``{"skus": [{"name",
"skuId", "description", "category": {"serviceDisplayName", "resourceFamily", "resourceGroup",
"usageType"}, "serviceRegions", "pricingInfo": [{"effectiveTime", "summary", "pricingExpression":
{"usageUnit", "usageUnitDescription", "baseUnit", "baseUnitDescription",
"baseUnitConversionFactor", "displayQuantity", "tieredRates": [{"startUsageAmount", "unitPrice":
{"currencyCode", "units", "nanos"}}]}, "aggregationInfo", "currencyConversionRate"}],
"serviceProviderName", "geoTaxonomy"}], "nextPageToken"}``, paged by ``pageSize`` /
``pageToken``. Prices are money in units (a string, as proto3 JSON writes int64) and nanos.
An unknown service answers 404 ``NOT_FOUND`` in Google's error shape; :meth:`inject` fails the
next calls with ``5xx`` (503 UNAVAILABLE) or ``auth`` (403 PERMISSION_DENIED).
"""
from __future__ import annotations

import base64
import threading
import uuid
from decimal import Decimal
from typing import Any, Iterator
from urllib.parse import parse_qs, urlsplit

from broker_sandbox.loopback import JsonGetHandler, LoopbackServer

try:  # the pytest fixtures (the sandbox runs these fakes where pytest may be absent)
    import pytest
except ImportError:  # pragma: no cover
    from broker_sandbox import _no_pytest as pytest  # type: ignore[no-redef]

COMPUTE_SERVICE = "6F81-5844-456A"


def money(usd: str | Decimal) -> dict[str, Any]:
    d = Decimal(str(usd))
    units = int(d)
    return {"currencyCode": "USD", "units": str(units), "nanos": int((d - units) * 1_000_000_000)}


class FakeCloudBilling(LoopbackServer):
    thread_name = "fake-billing"

    def __init__(self, page_size: int = 5000) -> None:  # the real API sends at most 5,000 a page
        self.page_size = self.default_page_size = page_size
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self.page_size = self.default_page_size
            self.skus: list[dict[str, Any]] = []
            self.faults: list[str] = []
            self.calls: list[str] = []

    def handler(self) -> type[JsonGetHandler]:
        return type("CloudBillingHandler", (JsonGetHandler,),
                    {"fake": self, "content_type": "application/json; charset=UTF-8"})

    # -- seeding --------------------------------------------------------------------------------
    def add_sku(self, description: str, resource_group: str, usd: str, regions: list[str], *,
                usage_type: str = "OnDemand", unit: str = "h",
                effective: str = "2026-11-20T08:00:00.000Z", tiers: list[tuple[float, str]] | None = None) -> str:
        """One Compute Engine SKU priced per ``unit`` (``h`` or ``GiBy.h``); ``tiers`` overrides
        the single tier with (startUsageAmount, usd) pairs."""
        sku_id = "-".join(uuid.uuid4().hex[i:i + 4].upper() for i in (0, 4, 8))
        rates = [{"startUsageAmount": start, "unitPrice": money(price)}
                 for start, price in (tiers or [(0, usd)])]
        sku = {
            "name": f"services/{COMPUTE_SERVICE}/skus/{sku_id}", "skuId": sku_id, "description": description,
            "category": {"serviceDisplayName": "Compute Engine", "resourceFamily": "Compute",
                         "resourceGroup": resource_group, "usageType": usage_type},
            "serviceRegions": list(regions),
            "pricingInfo": [{
                "effectiveTime": effective, "summary": "",
                "pricingExpression": {
                    "usageUnit": unit, "displayQuantity": 1, "tieredRates": rates,
                    "usageUnitDescription": "hour" if unit == "h" else "gibibyte hour",
                    "baseUnit": "s" if unit == "h" else "By.s",
                    "baseUnitDescription": "second" if unit == "h" else "byte second",
                    "baseUnitConversionFactor": 3600 if unit == "h" else 3865470566400},
                "aggregationInfo": {"aggregationLevel": "ACCOUNT", "aggregationInterval": "DAILY",
                                    "aggregationCount": 1},
                "currencyConversionRate": 1}],
            "serviceProviderName": "Google",
            "geoTaxonomy": {"type": "REGIONAL" if len(regions) == 1 else "MULTI_REGIONAL",
                            "regions": list(regions)},
        }
        with self._lock:
            self.skus.append(sku)
        return sku_id

    def add_machine(self, family: str, gpu_sku: str, regions: list[str], *, gpu: str, core: str, ram: str,
                    spot_gpu: str = "", spot_core: str = "", spot_ram: str = "") -> None:
        """The GPU, core and RAM SKUs of a machine family (``family`` "A3", "A2", "G2" or "N1")."""
        where = "Americas" if regions[0].startswith(("us", "northamerica")) else "EMEA"
        core_name = "N1 Predefined Instance Core" if family == "N1" else f"{family} Instance Core"
        ram_name = "N1 Predefined Instance Ram" if family == "N1" else f"{family} Instance Ram"
        self.add_sku(f"{gpu_sku} running in {where}", "GPU", gpu, regions)
        self.add_sku(f"{core_name} running in {where}", "CPU", core, regions)
        self.add_sku(f"{ram_name} running in {where}", "RAM", ram, regions, unit="GiBy.h")
        for name, group, usd, unit in ((gpu_sku, "GPU", spot_gpu, "h"), (core_name, "CPU", spot_core, "h"),
                                       (ram_name, "RAM", spot_ram, "GiBy.h")):
            if usd:
                self.add_sku(f"Spot Preemptible {name} running in {where}", group, usd, regions,
                             usage_type="Preemptible", unit=unit)

    def inject(self, kind: str, times: int = 1) -> None:
        if kind not in ("5xx", "auth"):
            raise ValueError(f"unknown fault {kind!r}")
        with self._lock:
            self.faults += [kind] * times

    # -- wire -----------------------------------------------------------------------------------
    def handle(self, raw: str) -> tuple[int, dict[str, Any]]:
        parts = urlsplit(raw)
        q = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        with self._lock:
            self.calls.append(parts.path)
            fault = self.faults.pop(0) if self.faults else ""
        if fault == "5xx":
            return 503, _error(503, "UNAVAILABLE", "The service is currently unavailable.")
        if fault == "auth":
            return 403, _error(403, "PERMISSION_DENIED", "The caller does not have permission")
        if parts.path == "/v1/services":
            return 200, {"services": [{"name": f"services/{COMPUTE_SERVICE}", "serviceId": COMPUTE_SERVICE,
                                       "displayName": "Compute Engine",
                                       "businessEntityName": "businessEntities/GCP"}]}
        prefix, _, rest = parts.path.partition("/v1/services/")
        service, _, tail = rest.partition("/")
        if prefix or tail != "skus":
            return 404, _error(404, "NOT_FOUND", f"Requested entity was not found: {parts.path}")
        if service != COMPUTE_SERVICE:
            return 404, _error(404, "NOT_FOUND", f"Service services/{service} not found.")
        if q.get("currencyCode", "USD") != "USD":
            return 400, _error(400, "INVALID_ARGUMENT", "Only USD is served by this fake.")
        try:
            start = int(base64.urlsafe_b64decode(q["pageToken"]).decode()) if q.get("pageToken") else 0
            size = min(int(q.get("pageSize") or 5000), self.page_size)  # the server may send fewer
        except ValueError:
            return 400, _error(400, "INVALID_ARGUMENT", "Invalid page token.")
        with self._lock:
            page = self.skus[start:start + size]
            more = start + size < len(self.skus)
        out: dict[str, Any] = {"skus": page, "nextPageToken": ""}
        if more:
            out["nextPageToken"] = base64.urlsafe_b64encode(str(start + size).encode()).decode()
        return 200, out


def _error(code: int, status: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "status": status}}


@pytest.fixture(scope="session")
def fake_billing_server() -> Iterator[FakeCloudBilling]:
    fake = FakeCloudBilling().start()
    try:
        yield fake
    finally:
        fake.stop()


@pytest.fixture
def fake_billing(fake_billing_server: FakeCloudBilling) -> Iterator[FakeCloudBilling]:
    fake_billing_server.reset()
    yield fake_billing_server
    fake_billing_server.reset()
