"""Reading and tearing down: Compute instances as the broker's :class:`Instance`, preemptions found
(also of spot VMs that ``instanceTerminationAction: DELETE`` removed), and deletion of a lease's
instances with its placement policy."""
from __future__ import annotations

import datetime as dt
import time
from typing import Any, Iterable, Sequence

from google.api_core import exceptions as gexc
from providers.gcp.sdk import compute_v1

from providers.base import LABEL_LEASE, Instance, InstanceState, Market, ProviderError, StopReason, TransientError
from providers.gcp.client import ComputeClient, _region_of, _Seen, _tail, log
from providers.gcp.errors import GONE_CODES, NAME, UNREADABLE_TEXT, map_error, operation_error
from providers.gcp.names import META_LEASE, META_OWNER, META_TYPE, placement_name

PREEMPTED = "compute.instances.preempted"

_STATES = {
    "PROVISIONING": InstanceState.PENDING, "STAGING": InstanceState.PENDING,
    "RUNNING": InstanceState.RUNNING, "REPAIRING": InstanceState.PENDING,
    "STOPPING": InstanceState.STOPPING, "SUSPENDING": InstanceState.STOPPING,
    "STOPPED": InstanceState.TERMINATED, "SUSPENDED": InstanceState.TERMINATED,
    "TERMINATED": InstanceState.TERMINATED,
}
_ALIVE = {"PROVISIONING", "STAGING", "RUNNING", "REPAIRING"}


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


def _unreadable(zone: str, name: str, values: dict[str, str]) -> str:
    """Why the broker's labels and metadata of an instance cannot be read ("" when they can): a
    value the answer could not carry as text (see ``providers.gcp.errors.note_status``). Logged
    and counted as a provider error (``UnreadableLabel``); a lease value so read names no lease."""
    bad = sorted(k for k, v in values.items() if k.startswith("broker-") and UNREADABLE_TEXT in v)
    if not bad:
        return ""
    why = f"label or metadata {', '.join(bad)} of {name} holds what a Compute answer cannot carry as text"
    TransientError(why, provider=NAME, code="UnreadableLabel", region=_region_of(zone), zone=zone)  # counted
    log.warning("gcp.instance.unreadable", provider=NAME, zone=zone, instance=name, keys=bad)
    return why


class ComputeInventory(ComputeClient):
    """What this broker has on Compute, and taking it down."""

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
        out = [self._to_instance(z, inst, preempted.get(z, {}).get(inst.id)) for z, inst in rows]
        made = list(out)
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
        self._remember(rows, made)
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
        elif inst.scheduling.provisioning_model == "FLEX_START":
            market = Market.QUEUED
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
        lease_id = meta.get(META_LEASE) or inst.labels.get(LABEL_LEASE, "")
        problem = _unreadable(zone, inst.name, {**dict(inst.labels), **meta})
        return Instance(
            provider=NAME, instance_id=inst.name, region=_region_of(zone), zone=zone,
            instance_type=meta.get(META_TYPE) or _tail(inst.machine_type), market=market, state=state,
            lease_id="" if UNREADABLE_TEXT in lease_id else lease_id, node_name=inst.name,
            private_ip=nics[0].network_i_p if nics else "", stop_reason=reason, stop_detail=detail,
            launched_at=_epoch(inst.creation_timestamp), problem=problem,
        )

    # -- memory of seen instances --------------------------------------------------------------

    def _remember(self, rows: Iterable[tuple[str, compute_v1.Instance]],
                  made: Sequence[Instance] | None = None) -> None:
        """Remember ``rows`` (``made``: them as :class:`Instance` already, in the same order)."""
        rows = list(rows)
        made = made if made is not None else [self._to_instance(z, raw) for z, raw in rows]
        seen = [(i.lease_id, i.instance_id, _Seen(z, raw.id, i.instance_type, i.market, i.launched_at))
                for (z, raw), i in zip(rows, made) if i.lease_id and raw.id]
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
