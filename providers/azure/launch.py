"""Launching a lease on Azure: one VM per node (an idempotent ``PUT`` per name), in a proximity
placement group for more than one node, adopting what a retry finds and deleting it all on failure."""
from __future__ import annotations

import base64
import time
from typing import Any, Mapping

from azure.core.exceptions import AzureError, ResourceNotFoundError
from azure.mgmt.compute import models as cm

from providers.azure.auth import _make_credential
from providers.azure.client import _norm_region, _ppg_name, _tag, _zone
from providers.azure.errors import _gone, _OperationTimeout, map_error
from providers.azure.inventory import ArmInventory
from providers.base import (
    TAG_LEASE,
    TAG_OWNER,
    Instance,
    InvalidRequestError,
    LaunchSpec,
    Market,
    ProviderError,
    Scope,
)
from providers.azure.settings import AzureSettings
from providers.settings import provider_table

NETWORK_API_VERSION = "2020-11-01"  # networkProfile.networkApiVersion for VM-created NICs


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


class AzureProvider(ArmInventory):
    """The :class:`providers.base.Provider` for Azure (see the package docstring)."""

    @classmethod
    def from_config(cls, settings: AzureSettings | Mapping[str, Any], owner: str, *, credential: Any = None
                    ) -> "AzureProvider":
        """Build from the ``[providers.azure]`` table. ``credential``: an ``azure.core``
        ``TokenCredential`` to use instead of the one ``credentials`` names (embedding, tests)."""
        parsed = provider_table(AzureSettings, "azure", settings)
        return cls(parsed, credential if credential is not None else _make_credential(parsed.credentials),
                   owner)

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
