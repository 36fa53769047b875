"""Reading and tearing down: ARM VMs as the broker's :class:`Instance` (state from the provisioning
state and the instance view, private IP from the NIC), and deleting VMs and placement groups."""
from __future__ import annotations

import re
import time
from typing import Any, Iterable, Sequence

from azure.core.exceptions import AzureError, ResourceNotFoundError
from azure.core.rest import HttpRequest

from providers.azure.client import ArmClient, _norm_region, _ppg_name, _tag
from providers.azure.errors import CAPACITY_CODES, _gone, _OperationTimeout, map_error
from providers.base import TAG_LEASE, TAG_OWNER, Instance, InstanceState, Market, StopReason, TransientError

NIC_READ_API_VERSION = "2024-05-01"  # Microsoft.Network api-version to read a NIC's private IP
_VM_ID = re.compile(r"^/subscriptions/[^/]+/resourceGroups/(?P<rg>[^/]+)/providers/"
                    r"Microsoft\.Compute/virtualMachines/(?P<name>[^/]+)$", re.I)
_PPG_ID = re.compile(r"^/subscriptions/[^/]+/resourceGroups/[^/]+/providers/"
                     r"Microsoft\.Compute/proximityPlacementGroups/[^/]+$", re.I)


class ArmInventory(ArmClient):
    """What this broker has on Azure, and taking it down."""

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
        problem = self._unreadable(vm)
        return Instance(
            provider="azure", instance_id=vm.id or self._arm_id("virtualMachines", vm.name),
            region=_norm_region(vm.location), zone=(vm.zones or [""])[0],
            instance_type=vm.hardware_profile.vm_size if vm.hardware_profile else "",
            market=market, state=state, lease_id=_readable(_tag(vm, TAG_LEASE)) or "", node_name=vm.name,
            private_ip=ip, stop_reason=reason, stop_detail=detail,
            launched_at=created.timestamp() if created else 0.0, problem=problem)

    def _unreadable(self, vm: Any) -> str:
        """Why the broker's tags of a VM cannot be read ("" when they can): a value that is no text
        (a lone surrogate JSON let through, written outside the broker). Logged and counted as a
        provider error (``UnreadableTag``); a lease tag so read names no lease."""
        bad = sorted(k for k, v in (vm.tags or {}).items()
                     if str(k).startswith("broker:") and _readable(v) is None)
        if not bad:
            return ""
        why = f"tag {', '.join(bad)} of {vm.name} is not text (written outside the broker)"
        TransientError(why, provider="azure", code="UnreadableTag", region=_norm_region(vm.location or ""))  # counted
        self._log.warning("instance.unreadable", vm=vm.name, tags=bad)
        return why

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


def _readable(value: Any) -> str | None:
    """``value`` when it is text that can be stored and logged, else None."""
    if not isinstance(value, str):
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate
        return None
    return value


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
