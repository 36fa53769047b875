"""What a market refresh asks the fake Compute API (mixed into :class:`broker_sandbox.gcp.FakeGcpCompute`).

- ``GET projects/P/regions/R``: the region with its ``quotas`` (``[{"metric", "limit", "usage"}]``,
  e.g. ``NVIDIA_H100_GPUS``, ``PREEMPTIBLE_NVIDIA_H100_GPUS``) and its ``zones`` (links).
- ``GET projects/P/aggregated/machineTypes`` and ``aggregated/acceleratorTypes``: ``items`` keyed
  ``zones/Z`` with ``machineTypes`` / ``acceleratorTypes`` lists (or a ``NO_RESULTS_ON_PAGE``
  warning), ``filter`` and paging as the zonal lists.
- ``GET projects/P/aggregated/reservations``: ``items`` keyed ``zones/Z`` with ``reservations``,
  each with ``specificReservation: {"count", "inUseCount", "instanceProperties": {"machineType",
  "guestAccelerators"}}`` (int64 as strings); ``inUseCount`` counts the live instances that
  consume it.

Zones: every zone of the bundled catalog's GCP regions sells every machine type, unless
:meth:`offer_only` narrows a type to some zones.
"""
from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import Any

import providers

REGIONS_CSV = Path(providers.__file__).resolve().parent / "data" / "regions.csv"
LINK = "https://www.googleapis.com/compute/v1"


def _catalog_zones() -> list[str]:
    zones: list[str] = []
    try:
        with REGIONS_CSV.open(newline="") as f:
            for row in csv.DictReader(f):
                if row.get("provider") == "gcp":
                    zones += (row.get("zones") or "").split()
    except OSError:
        pass
    for extra in ("us-central1-a", "us-central1-b", "europe-west4-a"):
        if extra not in zones:
            zones.append(extra)
    return sorted(set(zones))


class GcpMarketMixin:
    """Market state and routes; the host class provides ``_lock``, ``project``, ``_page``,
    ``_instances``, ``_reservations``, ``machine_types`` and ``accelerator_types``."""

    def _reset_market(self) -> None:
        self.zones: list[str] = _catalog_zones()
        self.region_quotas: dict[tuple[str, str], tuple[float, float]] = {}
        self.offered: dict[str, set[str]] = {}  # type -> zones (absent: every zone)

    # -- seeding --------------------------------------------------------------------------------
    def set_quota(self, region: str, metric: str, limit: float, usage: float = 0) -> None:
        with self._lock:  # type: ignore[attr-defined]
            self.region_quotas[(region, metric)] = (limit, usage)

    def offer_only(self, type_name: str, zones: list[str]) -> None:
        """Sell machine or accelerator type ``type_name`` only in ``zones``."""
        with self._lock:  # type: ignore[attr-defined]
            self.offered[type_name] = set(zones)
            self.zones = sorted(set(self.zones) | set(zones))

    def _sold(self, type_name: str, zone: str) -> bool:
        zones = self.offered.get(type_name)
        return zones is None or zone in zones

    # -- routes ---------------------------------------------------------------------------------
    def get_region(self, *, region: str, **_: Any) -> tuple[int, dict]:
        from broker_sandbox.gcp import HttpError

        zones = [z for z in self.zones if z.rsplit("-", 1)[0] == region]
        if not zones:
            raise HttpError(404, "notFound", f"The resource 'projects/{self.project}/regions/{region}' "  # type: ignore[attr-defined]
                                             "was not found")
        quotas = [{"metric": "CPUS", "limit": 2400.0, "usage": 0.0}]
        quotas += [{"metric": m, "limit": lim, "usage": use}
                   for (r, m), (lim, use) in sorted(self.region_quotas.items()) if r == region]
        return 200, {"kind": "compute#region", "id": str(abs(hash(region)) % 10**12), "name": region,
                     "description": region, "status": "UP",
                     "selfLink": f"{LINK}/projects/{self.project}/regions/{region}",  # type: ignore[attr-defined]
                     "zones": [f"{LINK}/projects/{self.project}/zones/{z}" for z in zones],  # type: ignore[attr-defined]
                     "quotas": quotas}

    def _aggregated(self, kind: str, key: str, rows: list[tuple[str, dict]], query: dict) -> tuple[int, dict]:
        from broker_sandbox.gcp import compile_filter

        keep = compile_filter(query.get("filter", ""))
        rows = [(z, r) for z, r in rows if keep(r)]
        page, token = self._page(rows, query)  # type: ignore[attr-defined]
        items: dict[str, dict] = {f"zones/{z}": {"warning": {
            "code": "NO_RESULTS_ON_PAGE", "message": f"There are no results for scope 'zones/{z}' on this page.",
            "data": [{"key": "scope", "value": f"zones/{z}"}]}} for z in self.zones}
        for z, r in page:
            scope = items.setdefault(f"zones/{z}", {})
            scope.pop("warning", None)
            scope.setdefault(key, []).append(r)
        out: dict[str, Any] = {"kind": kind, "id": f"projects/{self.project}/aggregated/{key}",  # type: ignore[attr-defined]
                               "items": items}
        if token:
            out["nextPageToken"] = token
        return 200, out

    def aggregated_machine_types(self, *, query: dict, **_: Any) -> tuple[int, dict]:
        rows = [(z, self._machine_type_json(z, n)) for z in self.zones  # type: ignore[attr-defined]
                for n in sorted(self.machine_types) if self._sold(n, z)]  # type: ignore[attr-defined]
        return self._aggregated("compute#machineTypeAggregatedList", "machineTypes", rows, query)

    def aggregated_accelerator_types(self, *, query: dict, **_: Any) -> tuple[int, dict]:
        rows = [(z, self._accel_json(z, n)) for z in self.zones  # type: ignore[attr-defined]
                for n in sorted(self.accelerator_types) if self._sold(n, z)]  # type: ignore[attr-defined]
        return self._aggregated("compute#acceleratorTypeAggregatedList", "acceleratorTypes", rows, query)

    def aggregated_reservations(self, *, query: dict, **_: Any) -> tuple[int, dict]:
        rows = []
        for (zone, name), res in sorted(self._reservations.items()):  # type: ignore[attr-defined]
            in_use = sum(1 for (z, _n), inst in self._instances.items()  # type: ignore[attr-defined]
                         if z == zone and inst.get("status") not in ("TERMINATED", "STOPPING")
                         and name in ((inst.get("reservationAffinity") or {}).get("values") or []))
            props: dict[str, Any] = {"machineType": res["machineType"]}
            if res.get("accelerator"):
                props["guestAccelerators"] = [{"acceleratorType": res["accelerator"],
                                               "acceleratorCount": res.get("accelerator_count", 1)}]
            rows.append((zone, {
                "kind": "compute#reservation", "id": str(abs(hash((zone, name))) % 10**12), "name": name,
                "zone": f"{LINK}/projects/{self.project}/zones/{zone}",  # type: ignore[attr-defined]
                "selfLink": f"{LINK}/projects/{self.project}/zones/{zone}/reservations/{name}",  # type: ignore[attr-defined]
                "specificReservationRequired": True, "status": "READY",
                "specificReservation": {"count": str(res["count"]), "inUseCount": str(in_use),
                                        "instanceProperties": props}}))
        return self._aggregated("compute#reservationAggregatedList", "reservations", rows, query)


_P = r"/compute/v1/projects/(?P<project>[^/]+)"
MARKET_ROUTES = [
    ("GET", re.compile(_P + r"/regions/(?P<region>[a-z]+-[a-z]+[0-9]+)"), "get_region"),
    ("GET", re.compile(_P + r"/aggregated/machineTypes"), "aggregated_machine_types"),
    ("GET", re.compile(_P + r"/aggregated/acceleratorTypes"), "aggregated_accelerator_types"),
    ("GET", re.compile(_P + r"/aggregated/reservations"), "aggregated_reservations"),
]
