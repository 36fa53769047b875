"""Launching a lease on Compute: all or nothing in one zone, one ``instances.insert`` per node with
a replay-safe ``requestId``, adopting what a retry finds and deleting everything on failure."""
from __future__ import annotations

import time
from typing import Any, Mapping, Sequence

from google.api_core import exceptions as gexc
from providers.gcp.sdk import compute_v1

from providers.base import (
    LABEL_LEASE,
    LABEL_OWNER,
    Instance,
    InvalidRequestError,
    LaunchSpec,
    Market,
    ProviderError,
    Shape,
    TransientError,
)
from providers.gcp.client import _region_of, log
from providers.gcp.credentials import SCOPES, load_credentials
from providers.gcp.errors import NAME, map_error, operation_error
from providers.gcp.fabric import gpu_nics
from providers.gcp.inventory import _ALIVE, ComputeInventory
from providers.gcp.names import (
    META_LEASE,
    META_OWNER,
    META_TYPE,
    NAME_RE,
    label_key,
    label_value,
    placement_name,
    request_id,
)
from providers.gcp.settings import GcpSettings
from providers.settings import provider_table

RESERVATION_KEY = "compute.googleapis.com/reservation-name"
GENERATIONS = 8  # requestIds tried per node and call when Compute replays finished attempts


class GcpProvider(ComputeInventory):
    """The :class:`providers.base.Provider` for Google Compute Engine."""

    @classmethod
    def from_config(cls, settings: GcpSettings | Mapping[str, Any], owner: str) -> "GcpProvider":
        """From the typed ``[providers.gcp]`` settings (or a raw table, checked by the schema)."""
        parsed = provider_table(GcpSettings, NAME, settings)
        return cls(parsed, owner, load_credentials(parsed))

    def notice_source(self) -> Any:
        """The zones' preemption operations (:class:`providers.gcp.preemptions.PreemptionOps`),
        unless ``preemption_poll_s`` is 0."""
        if not self.settings.preemption_poll_s:
            return None
        from providers.gcp.preemptions import PreemptionOps

        return PreemptionOps(self, self.settings.preemption_poll_s)

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

    def launch_shapes(self, spec: LaunchSpec, shapes: Sequence[Shape]) -> tuple[Shape, list[Instance]]:
        """The first of ``shapes`` Compute has capacity for, one regional ``bulkInsert`` per machine
        type across the shapes' zones (see :mod:`providers.gcp.bulk`); one shape is :meth:`launch`."""
        from providers.gcp.bulk import launch_shapes

        return launch_shapes(self, spec, shapes)

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
        if spec.market is Market.QUEUED:
            scheduling = flex_start(spec)
        nic = compute_v1.NetworkInterface(network=s.network)
        if s.subnetworks.get(spec.region):
            nic.subnetwork = s.subnetworks[spec.region]
        if s.external_ip:
            nic.access_configs = [compute_v1.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")]
        extra = gpu_nics(spec, s.gpu_network_prefix)
        if extra:
            nic.nic_type = "GVNIC"  # GPUDirect needs gVNIC on every NIC, the host's too
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
            network_interfaces=[nic, *extra],
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
        if not (self.settings.compact_placement and spec.count > 1) or spec.market is Market.RESERVED:
            # A reservation is consumed only by VMs naming the placement policy it was made with.
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

    def _rows_or_abort(self, spec: LaunchSpec, zone: str, lg: Any) -> list[tuple[str, compute_v1.Instance]]:
        try:
            return self._lease_rows(spec.lease_id, zone)
        except Exception as e:
            self._abort(spec, zone, map_error(e, region=spec.region, zone=zone), lg)
            raise  # unreachable: _abort raises


def flex_start(spec: LaunchSpec) -> compute_v1.Scheduling:
    """A flex-start VM's scheduling (Dynamic Workload Scheduler): started when capacity frees,
    deleted after ``spec.max_run_h`` (seven days when unset)."""
    from providers.gcp.flex import flex_start_scheduling

    d = flex_start_scheduling(spec.max_run_h or 168.0)
    return compute_v1.Scheduling(provisioning_model=d["provisioningModel"],
                                 max_run_duration=compute_v1.Duration(seconds=d["maxRunDuration"]["seconds"]),
                                 instance_termination_action=d["instanceTerminationAction"],
                                 on_host_maintenance=d["onHostMaintenance"], automatic_restart=False)
