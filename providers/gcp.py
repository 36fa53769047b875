"""Google Compute Engine: GPU VMs for a lease through ``google-cloud-compute`` (REST transport).

How the pieces of the protocol map onto Compute:

* **launch** is all-or-nothing in one zone: one ``instances.insert`` per node, each with a
  ``requestId`` that is a UUIDv5 of (client token, zone, node index, generation), so a retried
  call is de-duplicated by Compute itself; before inserting, the lease's instances are looked up
  by label, so a retry after a crash adopts what exists and creates only what is missing (and
  deletes the lease's instances elsewhere: leftovers of an earlier attempt). If any node fails,
  every instance of the lease is deleted and the mapped error raised.
  The *generation* covers Compute's requestId cache: a retry with the same token after a failed
  attempt gets the old operation back (DONE at once, with its error, or with its instance since
  deleted by the cleanup); such a replay moves on to the next generation's requestId.
* Operations are awaited with ``zoneOperations.wait`` through our own ``ZoneOperationsClient``
  (built with the same endpoint and credentials; the SDK's ``operation.result()`` would poll a
  client built without our ``api_endpoint``). Transient errors while waiting are retried until
  ``operation_timeout_s``.
* Spot: ``provisioningModel: SPOT``, ``instanceTerminationAction: DELETE``; GCP has no spot bid,
  so ``LaunchSpec.max_price_micros`` is not sent. On-demand and spot VMs say
  ``reservationAffinity: NO_RESERVATION`` so they never eat a reservation the broker accounts
  for; reserved ones consume exactly ``spec.reservation``.
* Labels ``broker-lease``/``broker-owner`` (sanitised to GCP's label rules) find the VMs; the
  exact lease id, owner and catalog instance type ride in metadata, which has no such rules.
* **Interruption**: a spot VM that is TERMINATED is reported INTERRUPTED, with the matching
  ``compute.instances.preempted`` zone operation as ``stop_detail`` when there is one. Because
  ``instanceTerminationAction: DELETE`` makes a preempted VM vanish, the provider remembers the
  instances it has seen per lease (name, zone, id) and, when one is gone, looks for a preempted
  operation targeting that instance id to still report it INTERRUPTED. That memory is per
  process: a VM preempted *and* deleted before this process ever saw it is reported as simply
  gone. ``terminate`` clears it.
* Compact placement (``compact_placement = true``): a multi-node lease gets a regional
  ``resourcePolicies`` entry ``broker-<lease>`` with ``groupPlacementPolicy.collocation:
  COLLOCATED`` (idempotent by name), named in every node's ``resourcePolicies``; it is deleted
  when the launch is rolled back and when ``terminate`` leaves it unused. Off by default: not
  every machine family supports it, and a reservation may carry its own placement.
"""
from __future__ import annotations

import datetime as dt
import re
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import requests
import structlog
from google.api_core import exceptions as gexc
from google.api_core.client_options import ClientOptions
from google.auth import exceptions as auth_exc
from google.cloud import compute_v1

from providers.settings import GcpSettings, provider_settings
from providers.base import (
    LABEL_LEASE,
    LABEL_OWNER,
    AuthError,
    CapacityError,
    Instance,
    InstanceState,
    InvalidRequestError,
    LaunchSpec,
    Market,
    ProviderError,
    QuotaError,
    Scope,
    StopReason,
    ThrottledError,
    TransientError,
)

log = structlog.get_logger("providers.gcp")

NAME = "gcp"
SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)
RESERVATION_KEY = "compute.googleapis.com/reservation-name"
PREEMPTED = "compute.instances.preempted"
META_LEASE, META_OWNER, META_TYPE = "broker-lease", "broker-owner", "broker-instance-type"
# A fixed namespace: request ids must be the same in every process for the same token.
REQUEST_NS = uuid.UUID("4d1c3d47-1f55-4a8a-9a53-6b0b9a0e6c21")
GENERATIONS = 8  # requestIds tried per node and call when Compute replays finished attempts
WAIT_CALL_S = 150.0  # zoneOperations.wait holds up to ~2 minutes server-side
NAME_RE = re.compile(r"^[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?$")

CAPACITY_CODES = {"ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
                  "resourcePoolExhausted", "insufficientCapacity", "STOCKOUT"}
QUOTA_CODES = {"QUOTA_EXCEEDED", "quotaExceeded", "RESOURCE_QUOTA_EXCEEDED"}
THROTTLE_CODES = {"rateLimitExceeded", "userRateLimitExceeded", "RESOURCE_OPERATION_RATE_EXCEEDED",
                  "RATE_LIMIT_EXCEEDED"}
GONE_CODES = {"RESOURCE_NOT_FOUND", "notFound"}
# 4xx answers that only mean "not now": the resource is busy with another operation.
TRANSIENT_CODES = {"resourceNotReady", "RESOURCE_NOT_READY", "RESOURCE_OPERATION_IN_PROGRESS", "backendError",
                   "internalError"}

_STATES = {
    "PROVISIONING": InstanceState.PENDING, "STAGING": InstanceState.PENDING,
    "RUNNING": InstanceState.RUNNING, "REPAIRING": InstanceState.PENDING,
    "STOPPING": InstanceState.STOPPING, "SUSPENDING": InstanceState.STOPPING,
    "STOPPED": InstanceState.TERMINATED, "SUSPENDED": InstanceState.TERMINATED,
    "TERMINATED": InstanceState.TERMINATED,
}
_ALIVE = {"PROVISIONING", "STAGING", "RUNNING", "REPAIRING"}


# ---------------------------------------------------------------------------------------------
# Labels


def label_value(text: str) -> str:
    """``text`` under GCP's label-value rules: [a-z0-9_-], at most 63 characters."""
    return re.sub(r"[^a-z0-9_-]", "-", str(text).lower())[:63]


def label_key(text: str) -> str:
    """``text`` under GCP's label-key rules: a value that starts with a lowercase letter."""
    key = label_value(text)
    return key if key[:1].isalpha() else f"k-{key}"[:63]


def placement_name(lease_id: str) -> str:
    """The compact placement policy of a lease: a valid Compute resource name."""
    return f"broker-{label_value(lease_id).replace('_', '-')}"[:63].rstrip("-")


def request_id(client_token: str, zone: str, index: int, generation: int = 0) -> str:
    """The ``requestId`` of node ``index``'s insert: the same in every process for the same input."""
    return str(uuid.uuid5(REQUEST_NS, f"{client_token}|{zone}|{index}|{generation}"))


# ---------------------------------------------------------------------------------------------
# Errors


def classify(codes: Sequence[str], status: int | None, message: str, *, region: str = "",
             zone: str = "") -> ProviderError:
    """One GCP error (HTTP ``error.errors[].reason`` or Operation ``error.errors[].code``)."""
    codes = [c for c in codes if c]
    code = codes[0] if codes else (str(status) if status else "")
    text = message.lower()
    kw: dict[str, Any] = {"provider": NAME, "code": code, "region": region, "zone": zone}
    hit = set(codes)
    if hit & CAPACITY_CODES or "resource pool exhausted" in text or "does not have enough resources" in text:
        return CapacityError(message, scope=Scope.ZONE, **{**kw, "code": next(iter(hit & CAPACITY_CODES), code)})
    if hit & THROTTLE_CODES or status == 429:
        return ThrottledError(message, scope=Scope.REGION, **kw)
    if hit & QUOTA_CODES:
        return QuotaError(message, scope=Scope.REGION, **{**kw, "code": next(iter(hit & QUOTA_CODES))})
    if hit & TRANSIENT_CODES:
        return TransientError(message, scope=Scope.REGION, **kw)
    if status in (401, 403):
        return AuthError(message, scope=Scope.CLOUD, **kw)
    if status in (400, 404, 409, 412, 413, 422):
        return InvalidRequestError(message, scope=Scope.OFFER, **kw)
    return TransientError(message, scope=Scope.REGION, **kw)


def map_error(exc: BaseException, *, region: str = "", zone: str = "") -> ProviderError:
    """Any error a Compute call raised, as the provider error that decides failover."""
    if isinstance(exc, ProviderError):
        return exc
    if isinstance(exc, gexc.GoogleAPICallError):
        reasons = [e.get("reason", "") for e in exc.errors if isinstance(e, dict)]
        if exc.reason:
            reasons.append(exc.reason)
        return classify(reasons, exc.code if isinstance(exc.code, int) else None, exc.message or str(exc),
                        region=region, zone=zone)
    if isinstance(exc, (requests.exceptions.Timeout, TimeoutError)):
        return TransientError(f"Compute call timed out: {exc}", provider=NAME, code="TIMEOUT",
                              region=region, zone=zone)
    if isinstance(exc, (requests.exceptions.ConnectionError, ConnectionError)):
        return TransientError(f"cannot reach Compute: {exc}", provider=NAME, code="CONNECTION_ERROR",
                              region=region, zone=zone)
    if isinstance(exc, auth_exc.TransportError):
        return TransientError(f"cannot reach the token endpoint: {exc}", provider=NAME, code="AUTH_TRANSPORT",
                              region=region, zone=zone)
    if isinstance(exc, auth_exc.GoogleAuthError):  # refresh refused, anonymous asked to refresh, ...
        return AuthError(f"credentials refused: {exc}", provider=NAME, code=type(exc).__name__,
                         region=region, zone=zone)
    raise exc


def operation_error(op: compute_v1.Operation, *, region: str, zone: str) -> ProviderError | None:
    """The error a DONE operation ended with, if any."""
    errors = list(op.error.errors)
    if not errors and not op.http_error_status_code:
        return None
    message = "; ".join(e.message for e in errors if e.message) or op.http_error_message or "operation failed"
    return classify([e.code for e in errors], op.http_error_status_code or None, message,
                    region=region, zone=zone)


# ---------------------------------------------------------------------------------------------
# Settings


def load_credentials(settings: GcpSettings) -> Any:
    """``anonymous`` (loopback emulators only), a service-account key file, or ADC."""
    from google.auth import default as adc
    from google.auth.credentials import AnonymousCredentials
    from google.oauth2 import service_account

    how = settings.credentials
    if how == "anonymous":
        return AnonymousCredentials()
    if how in ("", "default", "adc"):
        try:
            creds, _project = adc(scopes=list(SCOPES))
        except auth_exc.DefaultCredentialsError as e:
            raise ValueError(f"providers.gcp.credentials: no Application Default Credentials found ({e})") from None
        return creds
    try:
        return service_account.Credentials.from_service_account_file(how, scopes=list(SCOPES))
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(f"providers.gcp.credentials: cannot read service-account key file {how!r} "
                          f"({type(e).__name__})") from None


# ---------------------------------------------------------------------------------------------


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


def _epoch(ts: str) -> float:
    if not ts:
        return 0.0
    try:
        return dt.datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def _preempted_detail(op: compute_v1.Operation) -> str:
    when = op.end_time or op.insert_time
    return f"{op.operation_type} {op.name} at {when}: {op.status_message or 'Instance was preempted.'}"


class GcpProvider:
    """The :class:`providers.base.Provider` for Google Compute Engine."""

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
        # operation.result() polls an operations client the SDK builds without client_options; make
        # it ours so nothing ever polls another endpoint (we poll with our own clients anyway).
        for client, key, ops in ((self._instances, "zone_operations", self._operations),
                                 (self._policies, "region_operations", self._region_operations)):
            services = getattr(client._transport, "_extended_operations_services", None)
            if isinstance(services, dict):
                services[key] = ops
        self._seen: dict[str, dict[str, _Seen]] = {}
        # (client token, zone, node index) → the requestId generation last used: a retry in this
        # process starts there instead of walking the replays again.
        self._generation: dict[tuple[str, str, int], int] = {}
        self._seen_lock = threading.Lock()

    @classmethod
    def from_config(cls, settings: GcpSettings | Mapping[str, Any], owner: str) -> "GcpProvider":
        """From the typed ``[providers.gcp]`` settings (or a raw table, checked by the schema)."""
        parsed = provider_settings(NAME, settings)
        return cls(parsed, owner, load_credentials(parsed))

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

    # -- launch --------------------------------------------------------------------------------

    def launch(self, spec: LaunchSpec) -> list[Instance]:
        zone = spec.zone or self.zones_for(spec.region)[0]
        lg = log.bind(provider=NAME, lease_id=spec.lease_id, region=spec.region, zone=zone,
                      instance_type=spec.instance.name, market=str(spec.market), count=spec.count)
        self._check_spec(spec, zone)
        region = spec.region
        names = list(spec.node_names)
        try:
            existing = self._lease_rows(spec.lease_id)
        except Exception as e:
            raise map_error(e, region=region, zone=zone) from e
        keep = {i.name for z, i in existing if z == zone and i.name in names and i.status in _ALIVE}
        stale = [(z, i.name) for z, i in existing if not (z == zone and i.name in keep)]
        if keep:
            lg.info("gcp.launch.adopt", nodes=sorted(keep))
        if stale:
            lg.warning("gcp.launch.stale", instances=[f"{z}/{n}" for z, n in stale])
            errors = self._delete(stale, lg)
            if errors:
                raise errors[0]
        missing = [i for i, n in enumerate(names) if n not in keep]
        if missing:
            policy = self._ensure_placement(spec, lg)
            self._create(spec, zone, missing, lg, policy)
            rows = self._rows_or_abort(spec, zone, lg)
        else:
            rows = [(z, i) for z, i in existing if z == zone and i.name in keep]
        by_name = {i.name: (z, i) for z, i in rows if i.name in names and i.status in _ALIVE}
        vanished = [n for n in names if n not in by_name]
        if vanished:
            self._abort(spec, zone, TransientError(
                f"instances {vanished} vanished after their insert operations succeeded", provider=NAME,
                code="INSTANCE_VANISHED", region=region, zone=zone), lg)
        ordered = [by_name[n] for n in names]
        for i in range(len(names)):
            self._generation.pop((spec.client_token, zone, i), None)
        self._remember(ordered)
        lg.info("gcp.launch.ok", nodes=names)
        return [self._to_instance(z, i) for z, i in ordered]

    def _check_spec(self, spec: LaunchSpec, zone: str) -> None:
        def bad(why: str, code: str = "INVALID_SPEC") -> InvalidRequestError:
            return InvalidRequestError(why, provider=NAME, code=code, region=spec.region, zone=zone)

        if spec.provider != NAME:
            raise bad(f"launch spec is for provider {spec.provider!r}, not gcp")
        if spec.count < 1 or len(spec.node_names) != spec.count:
            raise bad(f"launch spec asks for {spec.count} nodes with {len(spec.node_names)} names")
        if len(set(spec.node_names)) != len(spec.node_names):
            raise bad("node names repeat")
        wrong = [n for n in spec.node_names if not NAME_RE.match(n)]
        if wrong:
            raise bad(f"node names {wrong} are not GCP instance names (lowercase RFC 1035, at most 63)",
                      "INVALID_NAME")
        if _region_of(zone) != spec.region:
            raise bad(f"zone {zone} is not in region {spec.region}")
        if not spec.client_token:
            raise bad("launch spec has no client token")
        if spec.market is Market.RESERVED and not spec.reservation:
            raise bad("a reserved launch needs spec.reservation (the reservation name)", "RESERVATION_REQUIRED")

    def _create(self, spec: LaunchSpec, zone: str, indices: Sequence[int], lg: Any, policy: str = "") -> None:
        """Insert nodes ``indices`` and wait for them; on any failure clean the lease up and raise."""
        region = spec.region
        started: list[tuple[str, str]] = []  # (node name, operation name)
        error: ProviderError | None = None
        for i in indices:
            name = spec.node_names[i]
            try:
                op_name = self._insert(spec, zone, i, lg, policy)
            except Exception as e:
                error = map_error(e, region=region, zone=zone)
                lg.warning("gcp.insert.failed", node=name, code=error.code, error=type(error).__name__)
                break
            started.append((name, op_name))
        deadline = time.monotonic() + self.settings.operation_timeout_s
        for name, op_name in started:
            try:
                done = self._wait(zone, op_name, deadline, region, lg)
            except ProviderError as e:
                error = error or e
                continue
            failed = operation_error(done, region=region, zone=zone)
            if failed:
                lg.warning("gcp.insert.failed", node=name, operation=op_name, code=failed.code,
                           error=type(failed).__name__)
                error = error or failed
        if error:
            self._abort(spec, zone, error, lg)

    def _insert(self, spec: LaunchSpec, zone: str, index: int, lg: Any, policy: str = "") -> str:
        """Insert node ``index``; the name of the operation that creates it.

        Compute answers a known ``requestId`` with the original operation. One that is DONE at
        once is such a replay: if it failed, or succeeded but its instance is gone (deleted by a
        cleanup), that attempt is over and the next generation's requestId starts a new one."""
        name = spec.node_names[index]
        body = self._body(spec, zone, name)
        if policy:
            body.resource_policies = [policy]
        key = (spec.client_token, zone, index)
        first = self._generation.get(key, 0)
        for generation in range(first, first + GENERATIONS):
            self._generation[key] = generation
            req = compute_v1.InsertInstanceRequest(
                project=self.project, zone=zone, instance_resource=body,
                request_id=request_id(spec.client_token, zone, index, generation))
            op = self._instances.insert(request=req, timeout=self.settings.timeout_s, retry=None)
            lg.info("gcp.insert", node=name, operation=op.name, generation=generation)
            if op.status != compute_v1.Operation.Status.DONE:
                return op.name
            failed = operation_error(op, region=spec.region, zone=zone)
            if failed is None and self._exists(zone, name):
                return op.name
            lg.info("gcp.insert.replayed", node=name, operation=op.name, generation=generation,
                    code=failed.code if failed else "INSTANCE_GONE")
        raise TransientError(f"every requestId generation of {name} replayed a finished attempt",
                             provider=NAME, code="REQUEST_REPLAYED", region=spec.region, zone=zone)

    def _exists(self, zone: str, name: str) -> bool:
        try:
            self._instances.get(project=self.project, zone=zone, instance=name,
                                timeout=self.settings.timeout_s, retry=None)
        except gexc.NotFound:
            return False
        return True

    def _abort(self, spec: LaunchSpec, zone: str, error: ProviderError, lg: Any) -> None:
        """All-or-nothing: delete every instance of the lease, then raise ``error``."""
        try:
            rows = self._lease_rows(spec.lease_id)
        except Exception as e:  # the reconciler will find them by label
            lg.error("gcp.launch.cleanup_failed", error=str(map_error(e, region=spec.region, zone=zone)))
            raise error from None
        victims = [(z, i.name) for z, i in rows]
        if victims:
            lg.warning("gcp.launch.cleanup", instances=[f"{z}/{n}" for z, n in victims])
            for e in self._delete(victims, lg):
                lg.error("gcp.launch.cleanup_failed", error=str(e))
        self._drop_placement(spec.lease_id, spec.region, lg)
        raise error

    def _body(self, spec: LaunchSpec, zone: str, name: str) -> compute_v1.Instance:
        s = self.settings
        it = spec.instance
        if spec.market is Market.SPOT:
            scheduling = compute_v1.Scheduling(provisioning_model="SPOT", instance_termination_action="DELETE",
                                               on_host_maintenance="TERMINATE", automatic_restart=False)
            affinity = compute_v1.ReservationAffinity(consume_reservation_type="NO_RESERVATION")
        else:
            # GPUs cannot live-migrate: every GPU shape must terminate on host maintenance.
            scheduling = compute_v1.Scheduling(provisioning_model="STANDARD", on_host_maintenance="TERMINATE",
                                               automatic_restart=True)
            if spec.market is Market.RESERVED:
                affinity = compute_v1.ReservationAffinity(consume_reservation_type="SPECIFIC_RESERVATION",
                                                          key=RESERVATION_KEY, values=[spec.reservation])
            else:
                affinity = compute_v1.ReservationAffinity(consume_reservation_type="NO_RESERVATION")
        nic = compute_v1.NetworkInterface(network=s.network)
        if s.subnetworks.get(spec.region):
            nic.subnetwork = s.subnetworks[spec.region]
        if s.external_ip:
            nic.access_configs = [compute_v1.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")]
        items = [compute_v1.Items(key=META_LEASE, value=spec.lease_id),
                 compute_v1.Items(key=META_OWNER, value=self.owner),
                 compute_v1.Items(key=META_TYPE, value=it.name)]
        if spec.boot_script:
            items.append(compute_v1.Items(key="startup-script", value=spec.boot_script))
        body = compute_v1.Instance(
            name=name,
            machine_type=f"zones/{zone}/machineTypes/{it.sdk_machine_type}",
            scheduling=scheduling,
            reservation_affinity=affinity,
            disks=[compute_v1.AttachedDisk(boot=True, auto_delete=True,
                                           initialize_params=compute_v1.AttachedDiskInitializeParams(
                                               source_image=s.image, disk_size_gb=s.boot_disk_gb,
                                               disk_type=f"zones/{zone}/diskTypes/{s.boot_disk_type}"))],
            network_interfaces=[nic],
            labels=self._labels(spec),
            metadata=compute_v1.Metadata(items=items),
        )
        if it.accelerator_type:
            body.guest_accelerators = [compute_v1.AcceleratorConfig(
                accelerator_type=f"zones/{zone}/acceleratorTypes/{it.accelerator_type}",
                accelerator_count=it.gpus)]
        if s.service_account:
            body.service_accounts = [compute_v1.ServiceAccount(email=s.service_account, scopes=list(SCOPES))]
        return body

    def _labels(self, spec: LaunchSpec) -> dict[str, str]:
        ours = {LABEL_LEASE: label_value(spec.lease_id), LABEL_OWNER: self._owner_label}
        theirs = {label_key(k): label_value(v) for k, v in spec.tags.items()}
        theirs = {k: v for k, v in theirs.items() if k not in ours}
        if len(theirs) + len(ours) > 64:
            log.warning("gcp.labels.truncated", provider=NAME, lease_id=spec.lease_id, dropped=len(theirs) - 62)
            theirs = dict(sorted(theirs.items())[: 64 - len(ours)])
        return {**theirs, **ours}

    # -- compact placement ---------------------------------------------------------------------

    def _ensure_placement(self, spec: LaunchSpec, lg: Any) -> str:
        """The lease's compact placement policy (created if need be), or "" when not wanted."""
        if not (self.settings.compact_placement and spec.count > 1):
            return ""
        name = placement_name(spec.lease_id)
        body = compute_v1.ResourcePolicy(
            name=name, description=f"broker lease {spec.lease_id}",
            group_placement_policy=compute_v1.ResourcePolicyGroupPlacementPolicy(collocation="COLLOCATED"))
        try:
            # Idempotent by name: a retry finds it there (409) and uses it.
            op = self._policies.insert(project=self.project, region=spec.region, resource_policy_resource=body,
                                       timeout=self.settings.timeout_s, retry=None)
            done = self._wait("", op.name, time.monotonic() + self.settings.operation_timeout_s, spec.region, lg)
            failed = operation_error(done, region=spec.region, zone="")
            if failed and failed.code != "alreadyExists":
                raise failed
            lg.info("gcp.placement.created", policy=name)
        except gexc.Conflict:
            pass
        except Exception as e:
            raise map_error(e, region=spec.region) from e
        return f"projects/{self.project}/regions/{spec.region}/resourcePolicies/{name}"

    def _drop_placement(self, lease_id: str, region: str, lg: Any) -> None:
        """Delete the lease's placement policy once no instance uses it; leftovers are logged only."""
        if not self.settings.compact_placement:
            return
        name = placement_name(lease_id)
        try:
            op = self._policies.delete(project=self.project, region=region, resource_policy=name,
                                       timeout=self.settings.timeout_s, retry=None)
            self._wait("", op.name, time.monotonic() + self.settings.operation_timeout_s, region, lg)
        except gexc.NotFound:
            return
        except Exception as e:
            err = map_error(e, region=region)
            if err.code != "resourceInUseByAnotherResource":
                lg.warning("gcp.placement.delete_failed", policy=name, error=str(err))
            return
        lg.info("gcp.placement.deleted", policy=name)

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

    def _rows_or_abort(self, spec: LaunchSpec, zone: str, lg: Any) -> list[tuple[str, compute_v1.Instance]]:
        try:
            return self._lease_rows(spec.lease_id, zone)
        except Exception as e:
            self._abort(spec, zone, map_error(e, region=spec.region, zone=zone), lg)
            raise  # unreachable: _abort raises

    @staticmethod
    def _meta(inst: compute_v1.Instance) -> dict[str, str]:
        return {item.key: item.value for item in inst.metadata.items if item.key != "startup-script"}

    def describe(self, lease_id: str, region: str) -> list[Instance]:
        try:
            rows = [(z, i) for z, i in self._lease_rows(lease_id) if _region_of(z) == region]
            return self._report(rows, leases={lease_id}, regions={region})
        except Exception as e:
            raise map_error(e, region=region) from e

    def list_managed(self, regions: Sequence[str] | None = None) -> list[Instance]:
        wanted = set(regions) if regions else None
        try:
            rows = [(z, i) for z, i in self._aggregated(self._owner_filter())
                    if (wanted is None or _region_of(z) in wanted)
                    and self._meta(i).get(META_OWNER, self.owner) == self.owner]
            return self._report(rows, leases=None, regions=wanted)
        except Exception as e:
            raise map_error(e) from e

    def _report(self, rows: list[tuple[str, compute_v1.Instance]], *, leases: set[str] | None,
                regions: set[str] | None) -> list[Instance]:
        """Instances for ``rows``, with preemptions found, plus remembered ones a preemption deleted."""
        present = {(z, i.name) for z, i in rows}
        with self._seen_lock:
            gone = [(lease, name, seen) for lease, nodes in self._seen.items()
                    if leases is None or lease in leases
                    for name, seen in nodes.items()
                    if (seen.zone, name) not in present and (regions is None or _region_of(seen.zone) in regions)]
        dead_spot = {z for z, i in rows if i.status not in _ALIVE and self._is_spot(i)}
        zones = dead_spot | {seen.zone for _, _, seen in gone}
        preempted = {z: self._preemptions(z) for z in sorted(zones)}
        out = []
        for z, inst in rows:
            out.append(self._to_instance(z, inst, preempted.get(z, {}).get(inst.id)))
        for lease, name, seen in gone:
            op = preempted.get(seen.zone, {}).get(seen.instance_id)
            if op is None:  # deleted by someone, not preempted: it is simply gone
                self._forget(lease, name)
                continue
            out.append(Instance(
                provider=NAME, instance_id=name, region=_region_of(seen.zone), zone=seen.zone,
                instance_type=seen.instance_type, market=seen.market, state=InstanceState.TERMINATED,
                lease_id=lease, node_name=name, stop_reason=StopReason.INTERRUPTED,
                stop_detail=_preempted_detail(op), launched_at=seen.launched_at))
        self._remember(rows)
        return out

    def _preemptions(self, zone: str) -> dict[int, compute_v1.Operation]:
        """``compute.instances.preempted`` operations of ``zone``, by target instance id."""
        req = compute_v1.ListZoneOperationsRequest(project=self.project, zone=zone,
                                                   filter=f'operationType = "{PREEMPTED}"')
        ops: dict[int, compute_v1.Operation] = {}
        for op in self._operations.list(request=req, timeout=self.settings.timeout_s, retry=None):
            if op.operation_type == PREEMPTED and op.target_id:
                ops[op.target_id] = op
        return ops

    @staticmethod
    def _is_spot(inst: compute_v1.Instance) -> bool:
        return inst.scheduling.provisioning_model == "SPOT" or bool(inst.scheduling.preemptible)

    def _to_instance(self, zone: str, inst: compute_v1.Instance,
                     preempted: compute_v1.Operation | None = None) -> Instance:
        meta = self._meta(inst)
        spot = self._is_spot(inst)
        if spot:
            market = Market.SPOT
        elif inst.reservation_affinity.consume_reservation_type == "SPECIFIC_RESERVATION":
            market = Market.RESERVED
        else:
            market = Market.ON_DEMAND
        state = _STATES.get(inst.status, InstanceState.PENDING)
        reason, detail = StopReason.NONE, ""
        if state is InstanceState.TERMINATED:
            if preempted is not None:
                reason, detail = StopReason.INTERRUPTED, _preempted_detail(preempted)
            elif spot:
                # A spot VM we did not stop: the cloud took it back even if no operation says so.
                reason = StopReason.INTERRUPTED
                detail = f"{inst.status} at {inst.last_stop_timestamp or 'unknown time'} (spot)"
            else:
                reason, detail = StopReason.USER, f"{inst.status} at {inst.last_stop_timestamp or 'unknown time'}"
        nics = list(inst.network_interfaces)
        return Instance(
            provider=NAME, instance_id=inst.name, region=_region_of(zone), zone=zone,
            instance_type=meta.get(META_TYPE) or _tail(inst.machine_type), market=market, state=state,
            lease_id=meta.get(META_LEASE) or inst.labels.get(LABEL_LEASE, ""), node_name=inst.name,
            private_ip=nics[0].network_i_p if nics else "", stop_reason=reason, stop_detail=detail,
            launched_at=_epoch(inst.creation_timestamp),
        )

    # -- memory of seen instances --------------------------------------------------------------

    def _remember(self, rows: Iterable[tuple[str, compute_v1.Instance]]) -> None:
        seen = [(i.lease_id, i.instance_id, _Seen(z, raw.id, i.instance_type, i.market, i.launched_at))
                for z, raw in rows for i in [self._to_instance(z, raw)] if i.lease_id and raw.id]
        with self._seen_lock:
            for lease, name, entry in seen:
                self._seen.setdefault(lease, {})[name] = entry

    def _forget(self, lease_id: str, name: str) -> None:
        with self._seen_lock:
            nodes = self._seen.get(lease_id, {})
            nodes.pop(name, None)
            if not nodes:
                self._seen.pop(lease_id, None)

    def _forget_node(self, zone: str, name: str) -> None:
        """We deleted (zone, name) ourselves: it must never be reported as preempted."""
        with self._seen_lock:
            for lease in [lease for lease, nodes in self._seen.items()
                          if nodes.get(name) is not None and nodes[name].zone == zone]:
                self._seen[lease].pop(name)
                if not self._seen[lease]:
                    del self._seen[lease]

    # -- terminate -----------------------------------------------------------------------------

    def terminate(self, instances: Sequence[Instance]) -> None:
        targets = [(i.zone, i.node_name or i.instance_id) for i in instances if i.provider == NAME]
        lg = log.bind(provider=NAME, lease_id=",".join(sorted({i.lease_id for i in instances if i.lease_id})))
        errors = self._delete(targets, lg)
        for lease, region in sorted({(i.lease_id, i.region) for i in instances if i.lease_id and i.provider == NAME}):
            self._drop_placement(lease, region, lg)
        if errors:
            raise errors[0]
        lg.info("gcp.terminate.ok", instances=[f"{z}/{n}" for z, n in targets])

    def _delete(self, targets: Sequence[tuple[str, str]], lg: Any) -> list[ProviderError]:
        """Delete (zone, name) instances and wait; already gone is fine. Returns the errors."""
        errors: list[ProviderError] = []
        started: list[tuple[str, str, str]] = []
        for zone, name in targets:
            try:
                op = self._instances.delete(project=self.project, zone=zone, instance=name,
                                            timeout=self.settings.timeout_s, retry=None)
            except gexc.NotFound:
                self._forget_node(zone, name)
                continue
            except Exception as e:
                errors.append(map_error(e, region=_region_of(zone), zone=zone))
                continue
            started.append((zone, name, op.name))
            lg.info("gcp.delete", zone=zone, node=name, operation=op.name)
        deadline = time.monotonic() + self.settings.operation_timeout_s
        for zone, name, op_name in started:
            try:
                done = self._wait(zone, op_name, deadline, _region_of(zone), lg)
            except ProviderError as e:
                errors.append(e)
                continue
            failed = operation_error(done, region=_region_of(zone), zone=zone)
            if failed and failed.code not in GONE_CODES:
                errors.append(failed)
            else:
                self._forget_node(zone, name)
        return errors
