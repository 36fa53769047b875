"""The Compute plumbing every GCP operation goes through: the REST clients (one endpoint, one set of
credentials), zones of a region, waiting for operations, and listing the broker's instances."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import structlog
from google.api_core.client_options import ClientOptions
from providers.gcp.sdk import compute_v1

from providers.base import LABEL_LEASE, LABEL_OWNER, Market, TransientError
from providers.gcp.errors import NAME, map_error, note_status
from providers.gcp.names import META_LEASE, META_OWNER, label_value
from providers.gcp.settings import GcpSettings

log = structlog.get_logger("providers.gcp")

WAIT_CALL_S = 150.0  # zoneOperations.wait holds up to ~2 minutes server-side


@dataclass(frozen=True, slots=True)
class _Seen:
    """An instance of a lease this process has seen (to report it after a preemption deletes it)."""

    zone: str
    instance_id: int
    instance_type: str
    market: Market
    launched_at: float


def _region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def _tail(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1]


class ComputeClient:
    """The Compute clients of one project and broker owner, and the helpers that call them."""

    name = NAME

    def __init__(self, settings: GcpSettings, owner: str, credentials: Any) -> None:
        if not owner:
            raise ValueError("the broker's owner name (used in the broker-owner label) must not be empty")
        self.settings = settings
        self.project = settings.project
        self.owner = owner
        self._owner_label = label_value(owner)
        options = ClientOptions(api_endpoint=settings.api_endpoint) if settings.api_endpoint else None
        self._instances = compute_v1.InstancesClient(credentials=credentials, transport="rest",
                                                     client_options=options)
        self._operations = compute_v1.ZoneOperationsClient(credentials=credentials, transport="rest",
                                                           client_options=options)
        self._region_operations = compute_v1.RegionOperationsClient(credentials=credentials, transport="rest",
                                                                    client_options=options)
        self._policies = compute_v1.ResourcePoliciesClient(credentials=credentials, transport="rest",
                                                           client_options=options)
        self._region_instances = compute_v1.RegionInstancesClient(credentials=credentials, transport="rest",
                                                                  client_options=options)
        # operation.result() polls an operations client the SDK builds without client_options; make
        # it ours so nothing ever polls another endpoint (we poll with our own clients anyway).
        for client, key, ops in ((self._instances, "zone_operations", self._operations),
                                 (self._policies, "region_operations", self._region_operations),
                                 (self._region_instances, "region_operations", self._region_operations)):
            services = getattr(client._transport, "_extended_operations_services", None)
            if isinstance(services, dict):
                services[key] = ops
        for client in (self._instances, self._operations, self._region_operations, self._policies,
                       self._region_instances):
            session = getattr(client._transport, "_session", None)
            if session is not None and note_status not in session.hooks.setdefault("response", []):
                session.hooks["response"].append(note_status)  # the status of an unreadable answer
        self._seen: dict[str, dict[str, _Seen]] = {}
        # (client token, zone, node index) → the requestId generation last used: a retry in this
        # process starts there instead of walking the replays again.
        self._generation: dict[tuple[str, str, int], int] = {}
        self._seen_lock = threading.Lock()

    # -- zones ---------------------------------------------------------------------------------

    def zones_for(self, region: str) -> tuple[str, ...]:
        """Configured zones, else the catalog's zones of the region, else ``<region>-a``."""
        if region in self.settings.zones:
            return self.settings.zones[region]
        try:
            from providers import catalog

            reg = catalog.bundled().region(NAME, region)
        except (catalog.CatalogError, OSError, ValueError, KeyError):
            reg = None
        if reg and reg.zones:
            return tuple(z if z.startswith(f"{region}-") else f"{region}-{z}" for z in reg.zones)
        return (f"{region}-a",)

    # -- operations ----------------------------------------------------------------------------

    def _wait(self, zone: str, op_name: str, deadline: float, region: str, lg: Any) -> compute_v1.Operation:
        """Wait for an operation of ``zone`` (or of ``region`` when ``zone`` is "") to be DONE,
        riding out transient errors until ``deadline``."""
        pause = 0.2
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TransientError(f"operation {op_name} is not DONE after "
                                     f"{self.settings.operation_timeout_s:g}s", provider=NAME,
                                     code="OPERATION_TIMEOUT", region=region, zone=zone)
            try:
                if zone:
                    op = self._operations.wait(project=self.project, zone=zone, operation=op_name,
                                               timeout=min(remaining, WAIT_CALL_S), retry=None)
                else:
                    op = self._region_operations.wait(project=self.project, region=region, operation=op_name,
                                                      timeout=min(remaining, WAIT_CALL_S), retry=None)
            except Exception as e:
                err = map_error(e, region=region, zone=zone)
                if not err.retryable:
                    raise err from e
                lg.info("gcp.operation.retry", operation=op_name, code=err.code)
                time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
                pause = min(pause * 2, 5.0)
                continue
            if op.status == compute_v1.Operation.Status.DONE:
                return op

    # -- listing -------------------------------------------------------------------------------

    def _aggregated(self, filter_: str) -> list[tuple[str, compute_v1.Instance]]:
        """Every instance matching ``filter_`` in every zone, across pages."""
        req = compute_v1.AggregatedListInstancesRequest(project=self.project, filter=filter_)
        pager = self._instances.aggregated_list(request=req, timeout=self.settings.timeout_s, retry=None)
        rows: list[tuple[str, compute_v1.Instance]] = []
        for page in pager.pages:
            if page.unreachables:
                raise TransientError(f"Compute could not list {list(page.unreachables)}", provider=NAME,
                                     code="UNREACHABLE")
            for scope, scoped in page.items.items():
                if scoped.warning and scoped.warning.code == "UNREACHABLE":
                    raise TransientError(f"Compute could not list {scope}: {scoped.warning.message}",
                                         provider=NAME, code="UNREACHABLE")
                rows.extend((_tail(scope), inst) for inst in scoped.instances)
        return rows

    def _owner_filter(self) -> str:
        return f'labels.{LABEL_OWNER} = "{self._owner_label}"'

    def _lease_rows(self, lease_id: str, zone: str | None = None) -> list[tuple[str, compute_v1.Instance]]:
        """This owner's instances of ``lease_id`` (exact id, from metadata), optionally in one zone."""
        rows = self._aggregated(f"({self._owner_filter()}) "
                                f'(labels.{LABEL_LEASE} = "{label_value(lease_id)}")')
        return [(z, i) for z, i in rows
                if (zone is None or z == zone) and self._meta(i).get(META_LEASE, lease_id) == lease_id
                and self._meta(i).get(META_OWNER, self.owner) == self.owner]

    @staticmethod
    def _meta(inst: compute_v1.Instance) -> dict[str, str]:
        return {item.key: item.value for item in inst.metadata.items if item.key != "startup-script"}
