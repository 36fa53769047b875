"""Azure: GPU virtual machines through ``azure-mgmt-compute`` (``ComputeManagementClient``).

Configuration, the ``[providers.azure]`` table (:meth:`AzureProvider.from_config`):

=====================  ===========================================================================
``subscription_id``    required, the subscription's GUID
``resource_group``     required; every VM, NIC, disk and proximity placement group goes there
``regions``            list of locations the broker may use (empty: any); ``list_managed()`` with no
                       argument looks at every location
``base_url``           ARM endpoint, default ``https://management.azure.com``; plain ``http://`` is
                       accepted on loopback only (a fake ARM in tests)
``credentials``        ``default`` (``DefaultAzureCredential``), ``cli``, ``managed_identity``,
                       ``environment``, or ``anonymous`` (loopback ``base_url`` only)
``subnet_id``          the full ARM id of the subnet the NICs join, or a table region → subnet id
``image``              ``{publisher, offer, sku, version}``, a URN ``publisher:offer:sku:version``
                       or an image / gallery image id; default the Azure HPC Ubuntu 22.04 image
``admin_username``     default ``azureuser``
``ssh_public_key``     required, the OpenSSH public key text (password login is disabled)
``os_disk_gb``         default 256; ``os_disk_type`` default ``Premium_LRS``
``timeout_s``          per HTTP request (connect and read), default 60
``operation_timeout_s``  the longest one launch/terminate waits for its operations, default 1800
``poll_interval_s``    how often an operation is polled when ARM sends no ``Retry-After``, default 5
``retries``            the SDK's retries of one HTTP request (429, 5xx, resets), default 3
``accelerated_networking``  default true
=====================  ===========================================================================

How the broker's lease maps onto Azure:

* one VM per node, named ``spec.node_names[i]``: a ``PUT`` to the same name is idempotent, and a
  retried launch first lists the lease's VMs (tag ``broker:lease``) and only creates what is
  missing, re-``PUT``\\s what is still creating or failed, and adopts what succeeded;
* Spot: ``priority=Spot``, ``evictionPolicy=Delete``, ``billingProfile.maxPrice`` (-1 = up to the
  on-demand price); reserved: ``capacityReservation.capacityReservationGroup.id``;
* networking through VM-level ``networkProfile.networkInterfaceConfigurations``
  (``networkApiVersion`` 2020-11-01): Azure creates the NIC and deletes it with the VM, as it does
  the OS disk (``deleteOption=Delete``); no Network SDK is needed. The private IP is read from the
  NIC through the same authenticated pipeline;
* a lease of more than one node gets a proximity placement group ``broker-<lease>``, removed by
  :meth:`terminate` once it holds no VM. A group that outlived its VMs (its deletion failed during a
  launch's cleanup or a terminate) is listed by :meth:`list_managed` as a terminated entry of its
  lease whose id is the group's ARM id, so the reconciler removes it like any other leftover;
* the boot script goes in ``userData`` (base64) and is never logged.

Interruption: a Spot VM evicted with policy Delete is deleted by Azure; ARM then simply no longer
has it, and :meth:`describe` / :meth:`list_managed` return nothing for it. ARM has no field that
says "evicted", so the lease lifecycle treats a vanished Spot instance of a live lease as
interrupted. A Spot VM seen deallocated (policy Deallocate, never set by the broker, which never
deallocates) is reported ``TERMINATED`` / ``INTERRUPTED``. A VM whose creation failed stays in ARM
in provisioning state ``Failed`` with status ``ProvisioningState/failed/<code>``: reported
``TERMINATED`` with ``CAPACITY`` (allocation codes) or ``ERROR``.

Zones are Azure's own ``"1"``, ``"2"``, ``"3"``; a spec zone written ``eastus-1`` is accepted.

Plain HTTP to a loopback ``base_url`` (tests against a fake ARM) is the only thing that differs from
production, and it lives in the authentication policy chosen from the configuration
(:func:`_auth_policy`): ``anonymous`` sends no ``Authorization`` header at all, and a real
credential on a loopback ``base_url`` gets a bearer policy that allows non-TLS for loopback URLs
only. Every other setting sends bearer tokens over TLS as the SDK does by default.
"""
from __future__ import annotations

import base64
import re
import time
from typing import Any, Iterable, Mapping, Sequence

import structlog
from azure.core.exceptions import (
    AzureError,
    ClientAuthenticationError,
    HttpResponseError,
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceResponseError,
)
from azure.core.pipeline.policies import SansIOHTTPPolicy
from azure.core.rest import HttpRequest
from azure.mgmt.compute import ComputeManagementClient
from azure.mgmt.compute import models as cm
from azure.mgmt.core.policies import ARMChallengeAuthenticationPolicy

from providers.settings import ARM_URL, AzureSettings, is_loopback_url, provider_settings
from providers.base import (
    TAG_LEASE,
    TAG_OWNER,
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

__all__ = ["AzureProvider", "ANONYMOUS", "map_error"]

NETWORK_API_VERSION = "2020-11-01"  # networkProfile.networkApiVersion for VM-created NICs
NIC_READ_API_VERSION = "2024-05-01"  # Microsoft.Network api-version to read a NIC's private IP
_VM_ID = re.compile(r"^/subscriptions/[^/]+/resourceGroups/(?P<rg>[^/]+)/providers/"
                    r"Microsoft\.Compute/virtualMachines/(?P<name>[^/]+)$", re.I)
_PPG_ID = re.compile(r"^/subscriptions/[^/]+/resourceGroups/[^/]+/providers/"
                     r"Microsoft\.Compute/proximityPlacementGroups/[^/]+$", re.I)

# ARM error codes, as the Compute resource provider and ARM itself send them.
CAPACITY_CODES = {"AllocationFailed", "OverconstrainedAllocationRequest", "ZonalAllocationFailed",
                  "SkuNotAvailable", "OverconstrainedZonalAllocationRequest"}
QUOTA_CODES = {"QuotaExceeded", "OperationNotAllowedQuotaExceeded"}
THROTTLE_CODES = {"TooManyRequests", "SubscriptionRequestsThrottled", "RetryableError429"}
AUTH_CODES = {"AuthorizationFailed", "InvalidAuthenticationToken", "AuthenticationFailed",
              "ExpiredAuthenticationToken", "InvalidAuthenticationTokenTenant",
              "LinkedAuthorizationFailed", "InvalidAuthenticationTokenAudience"}
INVALID_CODES = {"InvalidParameter", "BadRequest", "InvalidTemplate", "InvalidRequestContent",
                 "LocationRequired", "InvalidResourceReference", "PropertyChangeNotAllowed",
                 "InvalidTagNameCharacters", "InvalidApiVersionParameter",
                 "MissingApiVersionParameter", "InvalidRequestFormat", "NotFound",
                 "ResourceNotFound", "OperationNotAllowed"}
SETUP_CODES = {"ResourceGroupNotFound", "SubscriptionNotFound", "InvalidSubscriptionId",
               "MissingSubscriptionRegistration", "DisallowedProvider", "SubscriptionNotRegistered"}
REGION_CODES = {"LocationNotAvailableForResourceType", "NoRegisteredProviderFound",
                "SkuNotAvailable"}
TRANSIENT_CODES = {"InternalServerError", "InternalExecutionError", "ServiceUnavailable",
                   "GatewayTimeout", "RetryableError", "Conflict", "OperationPreempted",
                   "InternalOperationError", "NetworkingInternalOperationError"}

log = structlog.get_logger("providers.azure")


# ---------------------------------------------------------------------------------------------
# Authentication: the one place where a loopback endpoint is treated differently.


class _Anonymous:
    """Marker credential: send no ``Authorization`` header (loopback endpoints only)."""

    def get_token(self, *scopes: str, **kwargs: Any) -> Any:  # never called: see _NoAuthPolicy
        raise ClientAuthenticationError("anonymous credentials have no token")

    def __repr__(self) -> str:
        return "ANONYMOUS"


ANONYMOUS = _Anonymous()


class _NoAuthPolicy(SansIOHTTPPolicy):
    """Authentication policy of ``credentials = "anonymous"``: sends no credentials at all."""


class _LoopbackBearerPolicy(ARMChallengeAuthenticationPolicy):
    """ARM bearer-token policy that also allows plain HTTP, for loopback URLs only.

    Chosen by :func:`_auth_policy` only when ``base_url`` is a loopback ``http://`` URL; any other
    request URL still has TLS enforced by the base policy.
    """

    def on_request(self, request: Any) -> None:
        if is_loopback_url(request.http_request.url):
            request.context["enforce_https"] = False
        super().on_request(request)


def _auth_policy(credential: Any, base_url: str, scopes: Sequence[str]) -> Any:
    """The authentication policy for this credential and endpoint (None = the SDK's default)."""
    if credential is ANONYMOUS:
        return _NoAuthPolicy()
    if base_url.lower().startswith("http://") and is_loopback_url(base_url):
        return _LoopbackBearerPolicy(credential, *scopes)
    return None


def _make_credential(kind: str) -> Any:
    if kind == "anonymous":
        return ANONYMOUS
    import azure.identity as identity  # only when Azure is enabled and really authenticates

    return {
        "default": identity.DefaultAzureCredential,
        "cli": identity.AzureCliCredential,
        "managed_identity": identity.ManagedIdentityCredential,
        "environment": identity.EnvironmentCredential,
    }[kind]()


# ---------------------------------------------------------------------------------------------
# Error mapping.


def _error_code_message(exc: HttpResponseError) -> tuple[str, str]:
    """The most specific ARM error code (a generic code defers to a known one in its details)."""
    err = getattr(exc, "error", None)
    code = getattr(err, "code", None) or ""
    message = getattr(err, "message", None) or ""
    if not code and exc.response is not None:
        try:
            body = exc.response.json()
        except Exception:  # not JSON
            body = None
        if isinstance(body, dict):
            inner = body.get("error") if isinstance(body.get("error"), dict) else body
            code, message = str(inner.get("code") or ""), str(inner.get("message") or "")
    known = CAPACITY_CODES | QUOTA_CODES | THROTTLE_CODES | AUTH_CODES
    if err is not None and code not in known:
        for d in getattr(err, "details", None) or []:
            if getattr(d, "code", None) in known:
                return d.code, d.message or message
    return code, message or exc.message or str(exc)


def _gone(exc: ResourceNotFoundError, kind: str, name: str) -> bool:
    """Does this 404 say that the resource ``kind/name`` (``virtualMachines/node-1``) does not
    exist? Only ARM's ``ResourceNotFound`` naming it does. The SDK raises ResourceNotFoundError
    for every 404 — a missing resource group, a parent, a regional front end's ``NotFound``, or
    another resource — and none of those says the VM is gone: taking them for "gone" would skip
    the DELETE and leave a VM running."""
    code, message = _error_code_message(exc)
    return code == "ResourceNotFound" and f"/{kind}/{name}'".lower() in message.lower()


def map_error(exc: BaseException, *, region: str = "", zone: str = "") -> ProviderError:
    """Map an Azure SDK error onto the broker's error types (``provider="azure"``)."""
    if isinstance(exc, ProviderError):
        return exc
    kw = dict(provider="azure", region=region, zone=zone)
    if isinstance(exc, HttpResponseError) and exc.response is not None:
        status = exc.status_code or 0
        code, message = _error_code_message(exc)
        if code in CAPACITY_CODES:
            scope = Scope.ZONE if code.startswith(("Zonal", "OverconstrainedZonal")) and zone \
                else Scope.REGION
            return CapacityError(message, code=code, scope=scope, **kw)
        if code in QUOTA_CODES or (code == "OperationNotAllowed" and "quota" in message.lower()):
            return QuotaError(message, code=code, scope=Scope.REGION, **kw)
        if status == 429 or code in THROTTLE_CODES:
            return ThrottledError(message, code=code or "TooManyRequests", **kw)
        if status in (401, 403) or code in AUTH_CODES:
            return AuthError(message, code=code or str(status), scope=Scope.CLOUD, **kw)
        if code in SETUP_CODES:
            return InvalidRequestError(message, code=code, scope=Scope.CLOUD, **kw)
        if code in REGION_CODES:
            return InvalidRequestError(message, code=code, scope=Scope.REGION, **kw)
        if status >= 500 or code in TRANSIENT_CODES:
            return TransientError(message, code=code or str(status), **kw)
        if code in INVALID_CODES or 400 <= status < 500:
            return InvalidRequestError(message, code=code or str(status), **kw)
        return TransientError(message, code=code or "OperationFailed", **kw)
    if isinstance(exc, ClientAuthenticationError):  # the credential could not get a token
        return AuthError(str(exc.message or exc), code="CredentialUnavailable", **kw)
    if isinstance(exc, ServiceResponseError):  # read timeout, reset mid-response
        return TransientError(str(exc.message or exc), code="ServiceResponseError", **kw)
    if isinstance(exc, ServiceRequestError):  # connect failure / timeout
        return TransientError(str(exc.message or exc), code="ServiceRequestError", **kw)
    if isinstance(exc, _OperationTimeout):
        return TransientError(str(exc), code="OperationTimeout", **kw)
    if isinstance(exc, AzureError):
        return TransientError(str(exc.message or exc), code=type(exc).__name__, **kw)
    raise exc


class _OperationTimeout(Exception):
    """A long-running operation did not finish within ``operation_timeout_s``."""


# ---------------------------------------------------------------------------------------------
# Configuration.


def _norm_region(r: str) -> str:
    return r.replace(" ", "").lower()


def image_reference(v: str | Mapping[str, str]) -> cm.ImageReference:
    """The SDK's image reference for ``image`` (a table, an image id or a URN; checked by the schema)."""
    if isinstance(v, Mapping):
        return cm.ImageReference(publisher=v["publisher"], offer=v["offer"], sku=v["sku"],
                                 version=v.get("version") or "latest")
    if v.lower().startswith("/communitygalleries/"):
        return cm.ImageReference(community_gallery_image_id=v)
    if v.lower().startswith("/sharedgalleries/"):
        return cm.ImageReference(shared_gallery_image_id=v)
    if v.startswith("/"):
        return cm.ImageReference(id=v)
    p, o, sku, ver = v.split(":")
    return cm.ImageReference(publisher=p, offer=o, sku=sku, version=ver)


# ---------------------------------------------------------------------------------------------


def _zone(z: str) -> str:
    """Azure's zone number from ``"1"`` or ``"eastus-1"`` (``""`` = regional)."""
    if not z:
        return ""
    m = re.search(r"(\d+)$", z)
    if not m:
        raise InvalidRequestError(f"zone {z!r} is not an Azure availability zone (1, 2, 3)",
                                  provider="azure", code="InvalidZone", zone=z)
    return m.group(1)


def _ppg_name(lease_id: str) -> str:
    return ("broker-" + re.sub(r"[^A-Za-z0-9_.-]", "-", lease_id))[:80].rstrip(".")


def _tag(vm: Any, key: str) -> str:
    return (vm.tags or {}).get(key, "")


class AzureProvider:
    """The :class:`providers.base.Provider` for Azure (see the module docstring)."""

    name = "azure"

    def __init__(self, settings: AzureSettings, credential: Any, owner: str) -> None:
        if not owner:
            raise ValueError("the broker's owner id (broker:owner tag) must not be empty")
        if credential is ANONYMOUS and not is_loopback_url(settings.base_url):
            raise ValueError("providers.azure.credentials = \"anonymous\" is only accepted with "
                             "providers.azure.base_url on a loopback address")
        self.settings = settings
        self.owner = owner
        self.resource_group = settings.resource_group
        self.regions = settings.regions
        self._log = log.bind(provider="azure")
        scopes = [f"{ARM_URL}/.default"]
        if settings.base_url != ARM_URL and not is_loopback_url(settings.base_url):
            scopes = [f"{settings.base_url}/.default"]  # sovereign / private clouds
        kwargs: dict[str, Any] = dict(
            base_url=settings.base_url,
            credential_scopes=scopes,
            polling_interval=settings.poll_interval_s,
            retry_total=settings.retries,
            connection_timeout=settings.timeout_s,
            read_timeout=settings.timeout_s,
        )
        policy = _auth_policy(credential, settings.base_url, scopes)
        if policy is not None:
            kwargs["authentication_policy"] = policy
        self._client = ComputeManagementClient(credential, settings.subscription_id, **kwargs)
        self._vms = self._client.virtual_machines

    @classmethod
    def from_config(cls, settings: AzureSettings | Mapping[str, Any], owner: str, *, credential: Any = None
                    ) -> "AzureProvider":
        """Build from the ``[providers.azure]`` table. ``credential``: an ``azure.core``
        ``TokenCredential`` to use instead of the one ``credentials`` names (embedding, tests)."""
        parsed = provider_settings("azure", settings)
        return cls(parsed, credential if credential is not None else _make_credential(parsed.credentials),
                   owner)

    def close(self) -> None:
        self._client.close()

    # ------------------------------------------------------------------------------ launch
    def launch(self, spec: LaunchSpec) -> list[Instance]:
        region, zone = _norm_region(spec.region), _zone(spec.zone)
        self._check_spec(spec, region)
        lg = self._log.bind(lease=spec.lease_id, region=region, zone=zone, market=str(spec.market),
                            instance_type=spec.instance.sdk_machine_type, count=spec.count)
        subnet = self._subnet(region)
        try:
            existing = {vm.name.lower(): vm for vm in self._list()}
        except AzureError as e:
            raise map_error(e, region=region, zone=zone) from e

        adopted: dict[str, Any] = {}
        todo: list[str] = []
        deadline = time.monotonic() + self.settings.operation_timeout_s
        for node in spec.node_names:
            vm = existing.get(node.lower())
            if vm is None:
                todo.append(node)
                continue
            if _tag(vm, TAG_LEASE) != spec.lease_id:
                raise InvalidRequestError(
                    f"a VM named {node} already exists in resource group {self.resource_group} "
                    "and does not belong to this lease", provider="azure", code="VmNameInUse",
                    region=region, zone=zone)
            if _norm_region(vm.location) != region:
                raise InvalidRequestError(
                    f"VM {node} of this lease exists in {vm.location}, not {region}: terminate "
                    "it before launching elsewhere", provider="azure", code="LeaseInOtherRegion",
                    region=region, zone=zone)
            state = (vm.provisioning_state or "").lower()
            if state == "succeeded":
                adopted[node] = vm
            else:
                if state == "deleting":
                    self._wait_gone(node, deadline, region, zone)
                todo.append(node)  # creating / updating / failed: the PUT is idempotent
        if adopted:
            lg.info("launch.adopt", nodes=sorted(adopted))
        if not todo:
            return [self._instance(adopted[n], ip=self._private_ip(adopted[n], region, zone))
                    for n in spec.node_names]

        lg.info("launch.start", nodes=todo)
        errors: dict[str, BaseException] = {}
        created: dict[str, Any] = {}
        ppg_id = None
        try:
            if spec.count > 1:
                ppg_id = self._ensure_ppg(spec, region, zone)
            pollers = {}
            for node in todo:
                body = self._vm_body(spec, node, region, zone, subnet, ppg_id)
                try:
                    pollers[node] = self._vms.begin_create_or_update(self.resource_group, node, body)
                except AzureError as e:
                    errors[node] = e
                    break  # all-or-nothing: do not start more nodes once one is refused
            for node, poller in pollers.items():
                try:
                    created[node] = self._wait(poller, deadline)
                except (AzureError, _OperationTimeout) as e:
                    errors[node] = e
        except AzureError as e:  # the placement group
            errors["<placement group>"] = e
        if errors:
            order = {n: i for i, n in enumerate(spec.node_names)}
            first_node = min(errors, key=lambda n: order.get(n, -1))
            err = map_error(errors[first_node], region=region, zone=zone)
            lg.warning("launch.failed", error=type(err).__name__, code=err.code, scope=str(err.scope),
                       node=first_node, failed=sorted(errors), message=err.message)
            self._cleanup(spec, region, zone, lg)
            raise err from errors[first_node]
        vms = {**adopted, **created}
        out = [self._instance(vms[n], ip=self._private_ip(vms[n], region, zone))
               for n in spec.node_names]
        lg.info("launch.done", instances=[i.instance_id for i in out])
        return out

    def _check_spec(self, spec: LaunchSpec, region: str) -> None:
        def bad(msg: str, code: str = "InvalidLaunchSpec") -> InvalidRequestError:
            return InvalidRequestError(msg, provider="azure", code=code, region=region,
                                       zone=spec.zone)

        if spec.provider != "azure":
            raise bad(f"launch spec is for provider {spec.provider!r}, not azure")
        if spec.count < 1 or len(spec.node_names) != spec.count:
            raise bad(f"count {spec.count} does not match {len(spec.node_names)} node names")
        if len({n.lower() for n in spec.node_names}) != spec.count:
            raise bad("node names are not unique (Azure VM names ignore case)")
        if self.regions and region not in self.regions:
            raise InvalidRequestError(f"region {region} is not in providers.azure.regions",
                                      provider="azure", code="RegionNotConfigured",
                                      scope=Scope.REGION, region=region)
        if spec.market is Market.RESERVED and not spec.reservation:
            raise bad("a reserved launch needs the capacity reservation group (spec.reservation)")

    def _subnet(self, region: str) -> str:
        ids = self.settings.subnet_ids
        if isinstance(ids, str):
            return ids
        if region not in ids:
            raise InvalidRequestError(f"no subnet for {region}: add providers.azure.subnet_id.{region}",
                                      provider="azure", code="NoSubnet", scope=Scope.REGION,
                                      region=region)
        return ids[region]

    def _arm_id(self, kind: str, name: str) -> str:
        if name.startswith("/subscriptions/"):
            return name
        return (f"/subscriptions/{self.settings.subscription_id}/resourceGroups/"
                f"{self.resource_group}/providers/Microsoft.Compute/{kind}/{name}")

    def _tags(self, spec: LaunchSpec, node: str) -> dict[str, str]:
        return {**dict(spec.tags), "Name": node, TAG_LEASE: spec.lease_id, TAG_OWNER: self.owner}

    def _vm_body(self, spec: LaunchSpec, node: str, region: str, zone: str, subnet: str,
                 ppg_id: str | None) -> cm.VirtualMachine:
        s = self.settings
        nic = cm.VirtualMachineNetworkInterfaceConfiguration(
            name="nic0",
            properties=cm.VirtualMachineNetworkInterfaceConfigurationProperties(
                primary=True, delete_option="Delete",
                enable_accelerated_networking=s.accelerated_networking,
                ip_configurations=[cm.VirtualMachineNetworkInterfaceIPConfiguration(
                    name="ipconfig0",
                    properties=cm.VirtualMachineNetworkInterfaceIPConfigurationProperties(
                        primary=True, subnet=cm.SubResource(id=subnet)))]))
        props = cm.VirtualMachineProperties(
            hardware_profile=cm.HardwareProfile(vm_size=spec.instance.sdk_machine_type),
            storage_profile=cm.StorageProfile(
                image_reference=image_reference(s.image),
                os_disk=cm.OSDisk(create_option="FromImage", disk_size_gb=s.os_disk_gb,
                                  caching="ReadWrite", delete_option="Delete",
                                  managed_disk=cm.ManagedDiskParameters(
                                      storage_account_type=s.os_disk_type))),
            os_profile=cm.OSProfile(
                computer_name=node[:64], admin_username=s.admin_username,
                linux_configuration=cm.LinuxConfiguration(
                    disable_password_authentication=True,
                    ssh=cm.SshConfiguration(public_keys=[cm.SshPublicKey(
                        path=f"/home/{s.admin_username}/.ssh/authorized_keys",
                        key_data=s.ssh_public_key)]))),
            network_profile=cm.NetworkProfile(network_api_version=NETWORK_API_VERSION,
                                              network_interface_configurations=[nic]),
        )
        if spec.market is Market.SPOT:
            props.priority = "Spot"
            props.eviction_policy = "Delete"
            price = -1.0 if spec.max_price_micros <= 0 else spec.max_price_micros / 1_000_000
            props.billing_profile = cm.BillingProfile(max_price=price)
        else:
            props.priority = "Regular"
        if spec.market is Market.RESERVED:
            props.capacity_reservation = cm.CapacityReservationProfile(
                capacity_reservation_group=cm.SubResource(
                    id=self._arm_id("capacityReservationGroups", spec.reservation)))
        if ppg_id:
            props.proximity_placement_group = cm.SubResource(id=ppg_id)
        if spec.boot_script:
            props.user_data = base64.b64encode(spec.boot_script.encode()).decode()
        return cm.VirtualMachine(location=region, tags=self._tags(spec, node),
                                 zones=[zone] if zone else None, properties=props)

    def _ensure_ppg(self, spec: LaunchSpec, region: str, zone: str) -> str:
        name = _ppg_name(spec.lease_id)
        ppg = cm.ProximityPlacementGroup(
            location=region, zones=[zone] if zone else None,
            tags={TAG_LEASE: spec.lease_id, TAG_OWNER: self.owner},
            properties=cm.ProximityPlacementGroupProperties(proximity_placement_group_type="Standard"))
        out = self._client.proximity_placement_groups.create_or_update(self.resource_group, name, ppg)
        return out.id or self._arm_id("proximityPlacementGroups", name)

    def _wait(self, poller: Any, deadline: float) -> Any:
        poller.wait(timeout=max(0.0, deadline - time.monotonic()))
        if not poller.done():
            raise _OperationTimeout(f"operation not finished after "
                                    f"{self.settings.operation_timeout_s:g} s")
        return poller.result()

    def _wait_gone(self, name: str, deadline: float, region: str, zone: str) -> None:
        while True:
            try:
                self._vms.get(self.resource_group, name)
            except ResourceNotFoundError as e:
                if _gone(e, "virtualMachines", name):
                    return
                raise map_error(e, region=region, zone=zone) from e
            except AzureError as e:
                raise map_error(e, region=region, zone=zone) from e
            if time.monotonic() >= deadline:
                raise map_error(_OperationTimeout(f"VM {name} still deleting"), region=region,
                                zone=zone)
            time.sleep(max(self.settings.poll_interval_s, 0.05))

    def _cleanup(self, spec: LaunchSpec, region: str, zone: str, lg: Any) -> None:
        """Delete every VM of this launch (and its placement group); never raises."""
        try:
            self._delete_vms([(self.resource_group, n) for n in spec.node_names], region, zone)
            if spec.count > 1:
                self._delete_ppg_if_empty(spec.lease_id)
            lg.info("launch.cleaned_up", nodes=list(spec.node_names))
        except ProviderError as e:
            lg.error("launch.cleanup_failed", error=type(e).__name__, code=e.code,
                     message=e.message, note="tagged leftovers are found by the reconciler")

    # ------------------------------------------------------------------------------ read
    def _list(self) -> list[Any]:
        """Every VM in the resource group (the SDK follows ``nextLink``)."""
        return list(self._vms.list(self.resource_group))

    def describe(self, lease_id: str, region: str) -> list[Instance]:
        region = _norm_region(region)
        try:
            vms = [vm for vm in self._list()
                   if _tag(vm, TAG_LEASE) == lease_id and _norm_region(vm.location) == region]
            out = []
            for vm in vms:
                try:
                    view = self._vms.instance_view(self.resource_group, vm.name)
                except ResourceNotFoundError as e:
                    if _gone(e, "virtualMachines", vm.name):
                        continue  # vanished between the list and now (deleted or evicted)
                    raise
                inst = self._instance(vm, view)
                if inst.state in (InstanceState.RUNNING, InstanceState.PENDING):
                    inst = self._instance(vm, view, ip=self._private_ip(vm, region, ""))
                out.append(inst)
        except AzureError as e:
            raise map_error(e, region=region) from e
        return sorted(out, key=lambda i: i.node_name)

    def list_managed(self, regions: Sequence[str] | None = None) -> list[Instance]:
        """Every VM of this broker (tag ``broker:owner``) in ``regions`` (None: anywhere).

        The state comes from the VM's provisioning state, without an instance view per VM.
        """
        wanted = None if regions is None else {_norm_region(r) for r in regions}
        try:
            vms = self._list()
            ppgs = list(self._client.proximity_placement_groups.list_by_resource_group(self.resource_group))
        except AzureError as e:
            raise map_error(e) from e
        out = [self._instance(vm) for vm in vms if _tag(vm, TAG_OWNER) == self.owner]
        out += [self._empty_ppg(g) for g in ppgs if _tag(g, TAG_OWNER) == self.owner and not g.virtual_machines]
        return sorted((i for i in out if wanted is None or i.region in wanted),
                      key=lambda i: (i.lease_id, i.node_name))

    def _empty_ppg(self, ppg: Any) -> Instance:
        """A placement group with no VM left, as a terminated leftover of its lease."""
        return Instance(provider="azure", instance_id=ppg.id or self._arm_id("proximityPlacementGroups", ppg.name),
                        region=_norm_region(ppg.location), zone=(ppg.zones or [""])[0], instance_type="",
                        market=Market.ON_DEMAND, state=InstanceState.TERMINATED, lease_id=_tag(ppg, TAG_LEASE),
                        stop_reason=StopReason.USER, stop_detail="empty proximity placement group")

    def _private_ip(self, vm: Any, region: str, zone: str) -> str:
        refs = (vm.network_profile.network_interfaces if vm.network_profile else None) or []
        if not refs:
            return ""
        ref = next((r for r in refs if r.primary), refs[0])
        request = HttpRequest("GET", f"{ref.id}?api-version={NIC_READ_API_VERSION}")
        try:
            response = self._client.send_request(request)
            if response.status_code == 404:
                return ""
            response.raise_for_status()
            nic = response.json()
        except AzureError as e:
            raise map_error(e, region=region, zone=zone) from e
        ipcs = (nic.get("properties") or {}).get("ipConfigurations") or []
        ipcs = sorted(ipcs, key=lambda c: not (c.get("properties") or {}).get("primary", False))
        for ipc in ipcs:
            ip = (ipc.get("properties") or {}).get("privateIPAddress")
            if ip:
                return ip
        return ""

    def _instance(self, vm: Any, view: Any = None, ip: str = "") -> Instance:
        spot = (vm.priority or "") in ("Spot", "Low")
        reserved = bool(vm.capacity_reservation and vm.capacity_reservation.capacity_reservation_group)
        market = Market.SPOT if spot else Market.RESERVED if reserved else Market.ON_DEMAND
        state, reason, detail = _state(vm.provisioning_state or "", view, spot)
        created = vm.time_created
        return Instance(
            provider="azure", instance_id=vm.id or self._arm_id("virtualMachines", vm.name),
            region=_norm_region(vm.location), zone=(vm.zones or [""])[0],
            instance_type=vm.hardware_profile.vm_size if vm.hardware_profile else "",
            market=market, state=state, lease_id=_tag(vm, TAG_LEASE), node_name=vm.name,
            private_ip=ip, stop_reason=reason, stop_detail=detail,
            launched_at=created.timestamp() if created else 0.0)

    # ------------------------------------------------------------------------------ terminate
    def terminate(self, instances: Sequence[Instance]) -> None:
        if not instances:
            return
        targets: dict[tuple[str, str], tuple[str, str]] = {}
        for inst in instances:
            if _PPG_ID.match(inst.instance_id or ""):
                continue  # an empty placement group: removed with its lease below
            rg, name = _rg_name(inst, self.resource_group)
            targets.setdefault((rg.lower(), name.lower()), (rg, name))
        leases = sorted({i.lease_id for i in instances if i.lease_id})
        first = instances[0]
        lg = self._log.bind(lease=",".join(leases), count=len(targets))
        lg.info("terminate.start", vms=[name for _, name in targets.values()])
        self._delete_vms(list(targets.values()), first.region, first.zone)
        for lease in leases:
            self._delete_ppg_if_empty(lease)
        lg.info("terminate.done")

    def _delete_vms(self, targets: Iterable[tuple[str, str]], region: str, zone: str) -> None:
        """Delete VMs in parallel and wait; a VM already gone is fine. Raises the first error."""
        deadline = time.monotonic() + self.settings.operation_timeout_s
        pollers, errors = [], []
        for rg, name in targets:
            try:
                pollers.append((name, self._vms.begin_delete(rg, name)))
            except ResourceNotFoundError as e:
                if not _gone(e, "virtualMachines", name):
                    errors.append(e)
            except AzureError as e:
                errors.append(e)
        for name, poller in pollers:
            try:
                self._wait(poller, deadline)
            except ResourceNotFoundError as e:
                if not _gone(e, "virtualMachines", name):
                    errors.append(e)
            except (AzureError, _OperationTimeout) as e:
                errors.append(e)
        if errors:
            raise map_error(errors[0], region=region, zone=zone) from errors[0]

    def _delete_ppg_if_empty(self, lease_id: str) -> None:
        name = _ppg_name(lease_id)
        groups = self._client.proximity_placement_groups
        try:
            ppg = groups.get(self.resource_group, name)
        except ResourceNotFoundError as e:
            if _gone(e, "proximityPlacementGroups", name):
                return
            raise map_error(e) from e
        except AzureError as e:
            raise map_error(e) from e
        if _tag(ppg, TAG_OWNER) != self.owner or ppg.virtual_machines:
            return  # not ours, or another node of the lease still lives in it
        try:
            groups.delete(self.resource_group, name)
        except ResourceNotFoundError as e:
            if _gone(e, "proximityPlacementGroups", name):
                return
            raise map_error(e) from e
        except AzureError as e:
            raise map_error(e) from e
        self._log.info("placement_group.deleted", lease=lease_id, name=name)


def _rg_name(inst: Instance, default_rg: str) -> tuple[str, str]:
    m = _VM_ID.match(inst.instance_id or "")
    if m:
        return m["rg"], m["name"]
    return default_rg, inst.node_name or inst.instance_id


_CAPACITY_STOP = CAPACITY_CODES


def _state(provisioning: str, view: Any, spot: bool) -> tuple[InstanceState, StopReason, str]:
    """Instance state from the provisioning state and, when known, the instance view."""
    prov = provisioning.lower()
    statuses = list(getattr(view, "statuses", None) or [])
    power = next((s.code.split("/", 1)[1] for s in statuses
                  if (s.code or "").startswith("PowerState/")), "")
    failed = next((s for s in statuses if (s.code or "").startswith("ProvisioningState/failed")), None)
    if prov == "failed" or failed is not None:
        code = failed.code.split("/", 2)[2] if failed is not None and failed.code.count("/") >= 2 \
            else ""
        detail = f"{code}: {failed.message}" if failed is not None and failed.message else code
        reason = StopReason.CAPACITY if code in _CAPACITY_STOP else StopReason.ERROR
        return InstanceState.TERMINATED, reason, detail or "ProvisioningState/failed"
    if prov == "deleting":
        return InstanceState.STOPPING, StopReason.NONE, ""
    if power in ("deallocated", "deallocating"):
        if spot:  # the broker never deallocates: a deallocated Spot VM was evicted
            st = InstanceState.TERMINATED if power == "deallocated" else InstanceState.STOPPING
            return st, StopReason.INTERRUPTED, f"PowerState/{power}"
        st = InstanceState.TERMINATED if power == "deallocated" else InstanceState.STOPPING
        return st, StopReason.USER, f"PowerState/{power}"
    if power == "stopped":
        return InstanceState.TERMINATED, StopReason.USER, "PowerState/stopped"
    if power == "stopping":
        return InstanceState.STOPPING, StopReason.NONE, ""
    if prov == "creating" or power == "starting":
        return InstanceState.PENDING, StopReason.NONE, ""
    return InstanceState.RUNNING, StopReason.NONE, ""
