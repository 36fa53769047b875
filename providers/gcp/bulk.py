"""Launching a lease on the first of several shapes with Compute's ``regionInstances.bulkInsert``.

A bulkInsert creates one machine type, so the shapes are grouped by (type, market) in the order
of their best rank, and each group is one regional bulkInsert across the zones its shapes name
(``locationPolicy.locations``, ``targetShape: ANY_SINGLE_ZONE``: a gang lives in one zone; Compute
picks which of the allowed zones). ``count`` and ``minCount`` are the gang's size, so Compute
creates all of it or none; the node names are ``perInstanceProperties``; ``instanceProperties``
are what :meth:`providers.gcp.launch.GcpProvider.launch` inserts for one node (gVNIC and the GPU
NICs, the compact placement policy, scheduling, labels, metadata), with names instead of zonal
URLs. The requestId is derived from the lease's client token, so a repeated attempt gets the
same operation back. What a group got is read back by the lease's label and checked whole."""
from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any, Sequence

from providers.gcp.sdk import compute_v1

from providers.base import (
    AuthError,
    Instance,
    InvalidRequestError,
    LaunchSpec,
    Market,
    NoShapeAvailable,
    PartialFulfilment,
    ProviderError,
    Shape,
)
from providers.gcp.client import _region_of, log
from providers.gcp.errors import NAME, map_error, operation_error
from providers.gcp.inventory import _ALIVE
from providers.gcp.names import request_id

if TYPE_CHECKING:
    from providers.gcp.launch import GcpProvider

BULK_INDEX = 1_000_000  # requestId index space of bulk requests (per-node inserts use 0, 1, ...)


def by_type(shapes: Sequence[Shape]) -> list[list[Shape]]:
    """The shapes grouped by (type, market), groups in the order of their best-ranked shape."""
    groups: dict[tuple[str, Market], list[Shape]] = {}
    for s in shapes:
        groups.setdefault((s.instance.name, s.market), []).append(s)
    return list(groups.values())


def launch_shapes(p: "GcpProvider", spec: LaunchSpec, shapes: Sequence[Shape]) -> tuple[Shape, list[Instance]]:
    """:meth:`providers.base.ShapesProvider.launch_shapes` on Compute."""
    if not shapes:
        raise InvalidRequestError("a launch needs at least one shape", provider=NAME, code="NO_SHAPES",
                                  region=spec.region)
    if len(shapes) == 1 or any(s.market not in (Market.ON_DEMAND, Market.SPOT) for s in shapes):
        first = shapes[0]
        return first, p.launch(dataclasses.replace(spec, instance=first.instance, zone=first.zone,
                                                   market=first.market))
    lg = log.bind(provider=NAME, lease_id=spec.lease_id, region=spec.region, count=spec.count)
    failures: list[tuple[Shape, ProviderError]] = []
    for k, group in enumerate(by_type(shapes)):
        got = _one_bulk(p, spec, group, k, failures, lg)
        if got is not None:
            return got
    worst = failures[0][1] if failures else None
    raise NoShapeAvailable(
        f"bulkInsert created none of {len(shapes)} shapes: "
        + "; ".join(f"{s.instance.name} {s.zone or spec.region} {s.market}: {e.code}" for s, e in failures),
        failures=failures, provider=NAME, code=worst.code if worst else "ZONE_RESOURCE_POOL_EXHAUSTED",
        scope=worst.scope if worst else None, region=spec.region, zone=worst.zone if worst else "")


def _one_bulk(p: "GcpProvider", spec: LaunchSpec, group: list[Shape], k: int,
              failures: list[tuple[Shape, ProviderError]], lg: Any) -> tuple[Shape, list[Instance]] | None:
    region, names = spec.region, list(spec.node_names)
    zones = list(dict.fromkeys(s.zone or z for s in group for z in ([s.zone] if s.zone else p.zones_for(region))))
    lead = dataclasses.replace(spec, instance=group[0].instance, market=group[0].market, zone=zones[0])
    p._check_spec(lead, zones[0])
    existing = [(z, i) for z, i in _rows(p, spec, region) if i.name in names]
    live = [(z, i) for z, i in existing if i.status in _ALIVE]
    if len(live) == len(names) and len({z for z, _ in live}) == 1:  # a repeated attempt, whole
        return _result(p, spec, group, live)
    if existing:  # a part of an earlier try: gone before the names are used again
        errors = p._delete([(z, i.name) for z, i in existing], lg)
        if errors:
            raise errors[0]
    policy = p._ensure_placement(lead, lg)
    body = p._body(lead, zones[0], names[0])
    props = compute_v1.InstanceProperties(
        machine_type=lead.instance.sdk_machine_type, scheduling=body.scheduling,
        reservation_affinity=body.reservation_affinity, network_interfaces=list(body.network_interfaces),
        labels=dict(body.labels), metadata=body.metadata, service_accounts=list(body.service_accounts),
        disks=[compute_v1.AttachedDisk(boot=True, auto_delete=True, initialize_params=compute_v1.AttachedDiskInitializeParams(
            source_image=p.settings.image, disk_size_gb=p.settings.boot_disk_gb, disk_type=p.settings.boot_disk_type))],
        guest_accelerators=[compute_v1.AcceleratorConfig(accelerator_type=lead.instance.accelerator_type,
                                                         accelerator_count=lead.instance.gpus)]
        if lead.instance.accelerator_type else [])
    if policy:
        props.resource_policies = [policy.rsplit("/", 1)[-1]]
    resource = compute_v1.BulkInsertInstanceResource(
        count=len(names), min_count=len(names), instance_properties=props,
        per_instance_properties={n: compute_v1.BulkInsertInstanceResourcePerInstanceProperties(name=n)
                                 for n in names},
        location_policy=compute_v1.LocationPolicy(
            target_shape="ANY_SINGLE_ZONE",
            locations={f"zones/{z}": compute_v1.LocationPolicyLocation(preference="ALLOW") for z in zones}))
    rid = request_id(spec.client_token, region, BULK_INDEX + k)
    lg.info("gcp.bulk_insert", machine_type=lead.instance.sdk_machine_type, market=str(lead.market), zones=zones)
    try:
        op = p._region_instances.bulk_insert(
            request=compute_v1.BulkInsertRegionInstanceRequest(
                project=p.project, region=region, bulk_insert_instance_resource_resource=resource, request_id=rid),
            timeout=p.settings.timeout_s, retry=None)
        done = p._wait("", op.name, time.monotonic() + p.settings.operation_timeout_s, region, lg)
    except ProviderError:
        p._drop_placement(spec.lease_id, region, lg)
        raise
    except Exception as e:
        p._drop_placement(spec.lease_id, region, lg)
        raise map_error(e, region=region) from e
    failed = operation_error(done, region=region, zone="")
    if failed is not None:
        lg.warning("gcp.bulk_insert.failed", machine_type=lead.instance.sdk_machine_type, code=failed.code)
        p._drop_placement(spec.lease_id, region, lg)
        if failed.retryable or isinstance(failed, AuthError):
            raise failed
        for s in group:
            failures.append((s, failed))
        _cleanup(p, spec, region, lg)
        return None
    rows = [(z, i) for z, i in _rows(p, spec, region) if i.name in names]
    up = [(z, i) for z, i in rows if i.status in _ALIVE]
    if len(up) < len(names) or len({z for z, _ in up}) > 1:
        zone = up[0][0] if up else ""
        _cleanup(p, spec, region, lg)
        p._drop_placement(spec.lease_id, region, lg)
        raise PartialFulfilment(f"bulkInsert created {len(up)} live of {len(names)} instances; deleted them",
                                got=len(up), wanted=len(names), provider=NAME, code="PARTIAL_BULK_INSERT",
                                region=region, zone=zone)
    return _result(p, spec, group, up)


def _rows(p: "GcpProvider", spec: LaunchSpec, region: str) -> list[tuple[str, compute_v1.Instance]]:
    try:
        return [(z, i) for z, i in p._lease_rows(spec.lease_id) if _region_of(z) == region]
    except Exception as e:
        raise map_error(e, region=region) from e


def _cleanup(p: "GcpProvider", spec: LaunchSpec, region: str, lg: Any) -> None:
    try:
        victims = [(z, i.name) for z, i in _rows(p, spec, region)]
    except ProviderError as e:  # the reconciler finds them by label
        lg.error("gcp.launch.cleanup_failed", error=str(e))
        return
    for left in p._delete(victims, lg) if victims else []:
        lg.error("gcp.launch.cleanup_failed", error=str(left))


def _result(p: "GcpProvider", spec: LaunchSpec, group: list[Shape],
            rows: list[tuple[str, compute_v1.Instance]]) -> tuple[Shape, list[Instance]]:
    by_name = {i.name: (z, i) for z, i in rows}
    ordered = [by_name[n] for n in spec.node_names]
    p._remember(ordered)
    got = [p._to_instance(z, i) for z, i in ordered]
    zone = ordered[0][0]
    shape = next((s for s in group if s.zone == zone), None) or dataclasses.replace(group[0], zone=zone)
    log.info("gcp.bulk_insert.ok", provider=NAME, lease_id=spec.lease_id, zone=zone, nodes=list(spec.node_names))
    return shape, got
