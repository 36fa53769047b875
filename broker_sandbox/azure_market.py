"""Azure market APIs on loopback: the Retail Prices API, and the ARM calls a refresh makes.

:class:`FakeRetailPrices` serves ``GET /api/retail/prices`` (``api-version`` optional, ``$filter``
with ``eq`` comparisons joined by ``and``, ``$skip`` paging) answering ``{"BillingCurrency",
"CustomerEntityId", "CustomerEntityType", "Items": [...], "NextPageLink", "Count"}``; each item is a
meter as the real API returns it (``currencyCode``, ``retailPrice``, ``unitPrice``,
``armRegionName``, ``location``, ``effectiveStartDate``, ``meterName``, ``productName``,
``skuName`` — ``"... Spot"`` / ``"... Low Priority"`` —, ``serviceName``, ``unitOfMeasure``,
``type``, ``armSkuName``, ``isPrimaryMeterRegion``). A bad filter answers 400 like the real API.

:class:`ArmMarketMixin` adds to :class:`broker_sandbox.azure.FakeArm`:

- ``GET /subscriptions/S/providers/Microsoft.Compute/skus`` (``$filter=location eq 'L'``):
  ``resourceType``, ``name``, ``tier``, ``size``, ``family``, ``locations``, ``locationInfo``
  (``zones``), ``capabilities`` and ``restrictions`` (``type`` Location or Zone, ``values``,
  ``restrictionInfo``, ``reasonCode`` ``NotAvailableForSubscription``), ``nextLink`` paging.
- ``GET /subscriptions/S/providers/Microsoft.Compute/locations/L/usages``: ``[{"unit": "Count",
  "currentValue", "limit", "name": {"value", "localizedValue"}}]`` per VM family plus
  ``lowPriorityCores``; ``currentValue`` counts the vCPUs of the fake's VMs there.
- ``GET /subscriptions/S/providers/Microsoft.Compute/capacityReservationGroups`` and
  ``GET .../resourceGroups/RG/providers/Microsoft.Compute/capacityReservationGroups/G/capacityReservations``:
  the groups and their reservations (``sku {name, capacity}``, ``zones``,
  ``properties.virtualMachinesAssociated`` — the VMs that name the group and have that size).
"""
from __future__ import annotations

import re
import threading
import uuid
from decimal import Decimal
from typing import Any, Iterator
from urllib.parse import parse_qs, quote, urlsplit

from broker_sandbox.loopback import JsonGetHandler, LoopbackServer

LOCATIONS = {"eastus": "US East", "westeurope": "EU West", "westus2": "US West 2", "eastus2": "US East 2",
             "northeurope": "EU North", "swedencentral": "Sweden Central"}
_FILTER_TERM = re.compile(r"^\s*(\w+)\s+eq\s+'([^']*)'\s*$", re.I)


class FakeRetailPrices(LoopbackServer):
    thread_name = "fake-retail"

    def __init__(self, page_size: int = 100) -> None:
        self.page_size = self.default_page_size = page_size
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self.page_size = self.default_page_size
            self.items: list[dict[str, Any]] = []
            self.calls: list[str] = []
            self.fail_next = 0

    def handler(self) -> type[JsonGetHandler]:
        return type("RetailPricesHandler", (JsonGetHandler,), {"fake": self})

    @property
    def url(self) -> str:
        return f"{self.address}/api/retail/prices"

    def add_price(self, region: str, arm_sku: str, usd: str, *, spot: bool = False, low_priority: bool = False,
                  windows: bool = False, effective: str = "2026-11-01T00:00:00Z") -> None:
        size = arm_sku.removeprefix("Standard_").replace("_", " ")
        suffix = " Spot" if spot else " Low Priority" if low_priority else ""
        series = re.sub(r"^[A-Z]+\d+[a-z]*", lambda m: re.sub(r"\d+", "", m.group(0)), size)
        item = {
            "currencyCode": "USD", "tierMinimumUnits": 0.0, "retailPrice": float(Decimal(usd)),
            "unitPrice": float(Decimal(usd)), "armRegionName": region, "location": LOCATIONS.get(region, region),
            "effectiveStartDate": effective, "meterId": str(uuid.uuid4()), "meterName": f"{size}{suffix}",
            "productId": "DZH318Z0" + uuid.uuid4().hex[:4].upper(), "skuId": "DZH318Z0/" + uuid.uuid4().hex[:4],
            "productName": f"Virtual Machines {series} Series{' Windows' if windows else ''}",
            "skuName": f"{size}{suffix}", "serviceName": "Virtual Machines", "serviceId": "DZH313Z7MMC8",
            "serviceFamily": "Compute", "unitOfMeasure": "1 Hour", "type": "Consumption",
            "isPrimaryMeterRegion": True, "armSkuName": arm_sku,
        }
        with self._lock:
            self.items.append(item)

    def handle(self, raw: str) -> tuple[int, dict[str, Any]]:
        parts = urlsplit(raw)
        q = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        with self._lock:
            self.calls.append(raw)
            if self.fail_next:
                self.fail_next -= 1
                return 503, {"Error": {"Code": "ServiceUnavailable", "Message": "Service unavailable"}}
        if parts.path != "/api/retail/prices":
            return 404, {"Error": {"Code": "NotFound", "Message": "Not found"}}
        terms: list[tuple[str, str]] = []
        flt = q.get("$filter", "")
        for clause in re.split(r"\s+and\s+", flt, flags=re.I) if flt.strip() else []:
            m = _FILTER_TERM.match(clause)
            if not m:
                return 400, {"Error": {"Code": "BadRequest", "Message": f"Invalid OData filter: {flt}"}}
            terms.append((m.group(1), m.group(2)))
        try:
            skip = int(q.get("$skip", "0"))
        except ValueError:
            return 400, {"Error": {"Code": "BadRequest", "Message": "Invalid $skip"}}
        with self._lock:
            # Since 2023-01-01-preview, filter values are case-sensitive.
            # ``priceType`` filters the item's ``type`` field.
            rows = [i for i in self.items
                    if all(str(i.get("type" if f == "priceType" else f)) == v for f, v in terms)]
            size = self.page_size
        page = rows[skip:skip + size]
        nxt = None
        if skip + size < len(rows):
            args = "&".join(f"{quote(k)}={quote(v)}" for k, v in q.items() if k != "$skip")
            nxt = f"{self.url}?{args}&$skip={skip + size}"
        return 200, {"BillingCurrency": "USD", "CustomerEntityId": "Default", "CustomerEntityType": "Retail",
                     "Items": page, "NextPageLink": nxt, "Count": len(page)}


class ArmMarketMixin:
    """Resource SKUs, usages and capacity reservations for the fake ARM (see the module docstring).
    The host provides ``_lock``, ``sizes``, ``regions``, ``_vms``, ``_crgs``, ``url``, ``page_size``."""

    def _reset_market(self) -> None:
        self.families: dict[str, str] = {}  # size (lower) -> family
        self.size_vcpus: dict[str, int] = {}
        self.restricted_zones: dict[tuple[str, str], set[str]] = {}  # (location, size lower) -> zones
        self.restricted_locations: set[tuple[str, str]] = set()
        self.limits: dict[tuple[str, str], float] = {}  # (location, usage name) -> limit
        self.capacity_reservations: dict[tuple[str, str, str], dict[str, Any]] = {}  # (crg key, name)

    def set_family(self, size: str, family: str, vcpus: int) -> None:
        with self._lock:  # type: ignore[attr-defined]
            self.families[size.lower()] = family
            self.size_vcpus[size.lower()] = vcpus

    def restrict(self, location: str, size: str, zones: tuple[str, ...] = ()) -> None:
        """NotAvailableForSubscription: in ``zones`` of ``location``, or (no zones) the whole location."""
        with self._lock:  # type: ignore[attr-defined]
            if zones:
                self.restricted_zones[(location, size.lower())] = set(zones)
            else:
                self.restricted_locations.add((location, size.lower()))

    def set_limit(self, location: str, name: str, limit: float) -> None:
        with self._lock:  # type: ignore[attr-defined]
            self.limits[(location, name)] = limit

    def add_capacity_reservation(self, subscription: str, resource_group: str, group: str, name: str,
                                 size: str, capacity: int, zone: str = "") -> None:
        with self._lock:  # type: ignore[attr-defined]
            key = (subscription.lower(), resource_group.lower(), group.lower())
            crg = self._crgs[key]  # type: ignore[attr-defined]
            crg.setdefault("_reservations", {})[name] = {"size": size, "capacity": capacity, "zone": zone}

    def _family(self, size: str) -> str:
        return self.families.get(size.lower()) or "standard" + re.sub(
            r"^Standard_[A-Z]+\d+", "", size).replace("_", "") + "Family"

    def _vcpus(self, size: str) -> int:
        if size.lower() in self.size_vcpus:
            return self.size_vcpus[size.lower()]
        m = re.match(r"Standard_[A-Z]+(\d+)", size)
        return int(m.group(1)) if m else 0

    def _market_route(self, route: str, g: dict[str, str], query: dict[str, str]) -> tuple[int, Any, dict]:
        from broker_sandbox.azure import ArmError

        if route == "mkt_skus":
            loc = None
            m = re.match(r"^\s*location\s+eq\s+'([^']+)'\s*$", query.get("$filter", ""), re.I)
            if query.get("$filter") and not m:
                raise ArmError(400, "InvalidFilter", "Only location eq 'X' is supported in $filter.")
            if m:
                loc = m.group(1).lower()
            rows = []
            for location, zones in sorted(self.regions.items()):  # type: ignore[attr-defined]
                if loc and location != loc:
                    continue
                for size in sorted(self.sizes.values()):  # type: ignore[attr-defined]
                    rows.append(self._sku_json(location, zones, size))
            skip = int(query.get("$skiptoken", "0") or 0)
            page = rows[skip:skip + 200]
            out: dict[str, Any] = {"value": page}
            if skip + 200 < len(rows):
                out["nextLink"] = (f"{self.url}/subscriptions/{g['sub']}/providers/Microsoft.Compute/skus"  # type: ignore[attr-defined]
                                   f"?api-version={query['api-version']}&$skiptoken={skip + 200}"
                                   + (f"&$filter={quote(query['$filter'])}" if query.get("$filter") else ""))
            return 200, out, {}
        if route == "mkt_usages":
            loc = g["loc"].lower()
            used: dict[str, int] = {}
            for vm in self._vms.values():  # type: ignore[attr-defined]
                if vm.location != loc or vm.provisioning in ("Deleting", "Failed"):
                    continue
                size = (vm.props.get("hardwareProfile") or {}).get("vmSize", "")
                name = "lowPriorityCores" if vm.spot else self._family(size)
                used[name] = used.get(name, 0) + self._vcpus(size)
            names = {self._family(s) for s in self.sizes.values()} | {"lowPriorityCores", "cores"}  # type: ignore[attr-defined]
            value = [{"unit": "Count", "currentValue": used.get(n, 0),
                      "limit": self.limits.get((loc, n), 0 if n != "cores" else 350),
                      "name": {"value": n, "localizedValue": _localized(n)}} for n in sorted(names)]
            return 200, {"value": value}, {}
        if route == "mkt_crgs":
            groups = [c for k, c in self._crgs.items() if k[0] == g["sub"].lower()]  # type: ignore[attr-defined]
            return 200, {"value": [_public(c) for c in groups]}, {}
        if route == "mkt_crs":
            key = (g["sub"].lower(), g["rg"].lower(), g["name"].lower())
            crg = self._crgs.get(key)  # type: ignore[attr-defined]
            if crg is None:
                raise ArmError(404, "ResourceNotFound", "The capacity reservation group was not found.")
            value = []
            for name, r in sorted((crg.get("_reservations") or {}).items()):
                vms = [vm.id for vm in self._vms.values()  # type: ignore[attr-defined]
                       if ((vm.props.get("capacityReservation") or {}).get("capacityReservationGroup") or {})
                       .get("id", "").lower() == crg["id"].lower()
                       and (vm.props.get("hardwareProfile") or {}).get("vmSize", "").lower() == r["size"].lower()
                       and vm.provisioning not in ("Deleting", "Failed")]
                value.append({
                    "id": f"{crg['id']}/capacityReservations/{name}", "name": name,
                    "type": "Microsoft.Compute/capacityReservationGroups/capacityReservations",
                    "location": crg["location"], "zones": [r["zone"]] if r["zone"] else [],
                    "sku": {"name": r["size"], "capacity": r["capacity"]},
                    "properties": {"reservationId": str(uuid.uuid4()), "provisioningState": "Succeeded",
                                   "platformFaultDomainCount": 1,
                                   "virtualMachinesAssociated": [{"id": v} for v in vms]}})
            return 200, {"value": value}, {}
        raise ArmError(405, "MethodNotAllowed", "The requested method is not allowed.")

    def _sku_json(self, location: str, zones: frozenset, size: str) -> dict[str, Any]:
        restrictions = []
        if (location, size.lower()) in self.restricted_locations:
            restrictions.append({"type": "Location", "values": [location],
                                 "restrictionInfo": {"locations": [location]},
                                 "reasonCode": "NotAvailableForSubscription"})
        bad = self.restricted_zones.get((location, size.lower()))
        if bad:
            restrictions.append({"type": "Zone", "values": [location],
                                 "restrictionInfo": {"locations": [location], "zones": sorted(bad)},
                                 "reasonCode": "NotAvailableForSubscription"})
        return {"resourceType": "virtualMachines", "name": size, "tier": "Standard",
                "size": size.removeprefix("Standard_"), "family": self._family(size), "locations": [location],
                "locationInfo": [{"location": location, "zones": sorted(zones), "zoneDetails": []}],
                "capabilities": [{"name": "vCPUs", "value": str(self._vcpus(size))},
                                 {"name": "LowPriorityCapable", "value": "True"}],
                "restrictions": restrictions}


def _localized(name: str) -> str:
    if name == "lowPriorityCores":
        return "Total Regional Low-priority vCPUs"
    if name == "cores":
        return "Total Regional vCPUs"
    return re.sub(r"^standard", "Standard ", name).replace("Family", " Family vCPUs")


def _public(crg: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in crg.items() if not k.startswith("_")}


_SUB = r"^/subscriptions/(?P<sub>[^/]+)"
MARKET_ROUTES = [
    ("mkt_skus", re.compile(_SUB + r"/providers/Microsoft\.Compute/skus/?$", re.I)),
    ("mkt_usages", re.compile(_SUB + r"/providers/Microsoft\.Compute/locations/(?P<loc>[^/]+)/usages/?$", re.I)),
    ("mkt_crgs", re.compile(_SUB + r"/providers/Microsoft\.Compute/capacityReservationGroups/?$", re.I)),
    ("mkt_crs", re.compile(_SUB + r"/resourceGroups/(?P<rg>[^/]+)/providers/Microsoft\.Compute/"
                           r"capacityReservationGroups/(?P<name>[^/]+)/capacityReservations/?$", re.I)),
]


try:  # the fixtures (the fake ARM also runs alone, where pytest may be absent)
    import pytest
except ImportError:  # pragma: no cover
    pytest = None  # type: ignore[assignment]
else:

    @pytest.fixture(scope="session")
    def fake_retail_server() -> Iterator[FakeRetailPrices]:
        fake = FakeRetailPrices().start()
        try:
            yield fake
        finally:
            fake.stop()

    @pytest.fixture
    def fake_retail(fake_retail_server: FakeRetailPrices) -> Iterator[FakeRetailPrices]:
        fake_retail_server.reset()
        yield fake_retail_server
        fake_retail_server.reset()
