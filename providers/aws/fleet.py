"""Launching a lease on the first of several shapes in one EC2 Fleet ``instant`` request.

One request per market: a Fleet has one ``DefaultTargetCapacityType``, so the shapes are grouped
by market in the order of their best rank, and each group is one ``CreateFleet`` (spot shapes
first when the best-ranked shape is spot, then the on-demand ones, or the other way round). A
group's overrides carry the quote's ranking as ``Priority`` (0 is the best). On-demand groups
use the ``prioritized`` strategy, so EC2 launches the best-ranked shape it has capacity for; spot
groups use ``price-capacity-optimized`` (EC2 weighs price and spare capacity, the priorities then
only break ties). Each group asks for ``SingleInstanceType``, ``SingleAvailabilityZone`` and a
``MinTargetCapacity`` of the whole gang: a gang is one type in one zone, launched whole or not
at all, and the instances it got are checked again (a node terminated at launch rolls the gang
back, :class:`providers.base.PartialFulfilment`).

What the nodes are launched with is the lease's launch template, one per network layout (an EFA
gang's interfaces depend on the type's network cards): the image, boot script, tags, metadata
options, instance profile, root volume, the EFA interfaces and the gang's cluster placement group,
as :meth:`providers.aws.launch.AwsProvider.launch` gives them to ``RunInstances``. The templates
are deleted once the request is answered (the instances keep what they were launched with)."""
from __future__ import annotations

import base64
import dataclasses
import hashlib
from typing import TYPE_CHECKING, Any, Sequence

from providers.aws.client import _log
from providers.aws.errors import PROVIDER, code_error
from providers.aws.inventory import _launch_order
from providers.aws.names import _price, client_token
from providers.base import (
    Fabric,
    Instance,
    InvalidRequestError,
    LaunchSpec,
    Market,
    NoShapeAvailable,
    PartialFulfilment,
    ProviderError,
    Shape,
)

if TYPE_CHECKING:
    from providers.aws.launch import AwsProvider

_FLEET_MARKETS = {Market.ON_DEMAND: "on-demand", Market.SPOT: "spot"}
_LIVE = ("pending", "running")
# RunInstances parameters a launch template does not carry (the Fleet and its overrides do).
_NOT_IN_TEMPLATE = ("MinCount", "MaxCount", "ClientToken", "InstanceType", "InstanceMarketOptions",
                    "SubnetId", "Placement")
TOKEN_LIMIT = 64


def by_market(shapes: Sequence[Shape]) -> list[tuple[Market, list[Shape]]]:
    """The shapes grouped by market, groups in the order of their best-ranked shape."""
    groups: dict[Market, list[Shape]] = {}
    for s in shapes:
        groups.setdefault(s.market, []).append(s)
    return list(groups.items())


def fleet_token(spec_token: str, market: Market) -> str:
    """CreateFleet's ``ClientToken`` for one market's request of a launch attempt."""
    token = f"{spec_token}-{_FLEET_MARKETS[market]}"
    if len(token) <= TOKEN_LIMIT and token.isascii() and token.isprintable():
        return token
    return "f-" + hashlib.sha256(token.encode()).hexdigest()[: TOKEN_LIMIT - 2]


def launch_shapes(p: "AwsProvider", spec: LaunchSpec, shapes: Sequence[Shape]) -> tuple[Shape, list[Instance]]:
    """:meth:`providers.base.ShapesProvider.launch_shapes` on EC2."""
    if not shapes:
        raise InvalidRequestError("a launch needs at least one shape", provider=PROVIDER, code="NoShapes",
                                  region=spec.region, zone=spec.zone)
    if len(shapes) == 1:
        first = shapes[0]
        spec = _for_shape(spec, first)
        return first, p.launch(spec)
    odd = [s for s in shapes if s.market not in _FLEET_MARKETS]
    if odd:
        raise InvalidRequestError(f"{odd[0].market} capacity is launched on its own, not in a Fleet",
                                  provider=PROVIDER, code="MarketNotInFleet", region=spec.region)
    spec = _for_shape(spec, shapes[0])
    p._check(spec)
    log = _log.bind(provider=PROVIDER, lease_id=spec.lease_id, region=spec.region)
    found = sorted(p._describe(spec.region, p._mine(spec.lease_id)), key=_launch_order)
    live = [r for r in found if r["State"]["Name"] in _LIVE]
    if live:  # a repeated attempt: what the first one launched, if it is whole
        dead = [r for r in found if r["State"]["Name"] not in _LIVE]
        adopted = p._adopt(spec, live, dead, log)
        return _shape_of(spec, shapes, adopted), adopted
    group = p._ensure_placement_group(spec, "") if spec.count > 1 else ""
    failures: list[tuple[Shape, ProviderError]] = []
    try:
        for market, candidates in by_market(shapes):
            got = _one_fleet(p, spec, market, candidates, group, fleet_token(client_token(spec), market),
                             failures, log)
            if got is not None:
                return got
    except ProviderError:
        if group:
            p._delete_placement_group(spec.region, group)
        raise
    if group:
        p._delete_placement_group(spec.region, group)
    worst = failures[0][1] if failures else None
    raise NoShapeAvailable(
        f"EC2 Fleet launched none of {len(shapes)} shapes: "
        + "; ".join(f"{s.instance.name} {s.zone or spec.region} {s.market}: {e.code}" for s, e in failures),
        failures=failures, provider=PROVIDER, code=worst.code if worst else "InsufficientInstanceCapacity",
        scope=worst.scope if worst else None, region=spec.region, zone=worst.zone if worst else "")


def _for_shape(spec: LaunchSpec, s: Shape) -> LaunchSpec:
    return dataclasses.replace(spec, instance=s.instance, zone=s.zone, market=s.market)


def _shape_of(spec: LaunchSpec, shapes: Sequence[Shape], got: Sequence[Instance]) -> Shape:
    for s in shapes:
        if got and all(s.matches(i) for i in got):
            return s
    raise InvalidRequestError(f"lease {spec.lease_id} already has nodes of a shape it did not ask for "
                              f"({got[0].instance_type if got else '?'})", provider=PROVIDER,
                              code="ShapeMismatch", region=spec.region)


def _one_fleet(p: "AwsProvider", spec: LaunchSpec, market: Market, shapes: list[Shape], group: str,
               token: str, failures: list[tuple[Shape, ProviderError]],
               log: Any) -> tuple[Shape, list[Instance]] | None:
    """One CreateFleet for ``shapes`` (all of ``market``): what it got, or None after adding each
    refused shape to ``failures``. A gang it got only part of is terminated (PartialFulfilment)."""
    region, n = spec.region, spec.count
    layouts: dict[int, list[tuple[int, Shape]]] = {}
    for rank, s in enumerate(shapes):
        nics = s.instance.fabric_nics if s.instance.fabric_for(n) is Fabric.EFA else -1
        layouts.setdefault(nics, []).append((rank, s))
    templates: list[str] = []
    configs = []
    try:
        for k, members in enumerate(layouts.values()):
            name = f"broker-{token}-{k}"[:128]
            lead = members[0][1]
            data = _template_data(p, _for_shape(spec, lead), lead.zone, group)
            try:
                p._call(region, "", "create_launch_template", LaunchTemplateName=name, LaunchTemplateData=data,
                        TagSpecifications=[{"ResourceType": "launch-template", "Tags": p._tags(spec)}])
            except InvalidRequestError as e:
                if "AlreadyExists" not in e.code:
                    raise
            templates.append(name)
            configs.append({"LaunchTemplateSpecification": {"LaunchTemplateName": name, "Version": "$Latest"},
                            "Overrides": [_override(p, spec, s, rank) for rank, s in members]})
        kind = _FLEET_MARKETS[market]
        options = {"SingleInstanceType": True, "SingleAvailabilityZone": True, "MinTargetCapacity": n}
        params: dict[str, Any] = {
            "Type": "instant", "ClientToken": token, "LaunchTemplateConfigs": configs,
            "TargetCapacitySpecification": {"TotalTargetCapacity": n, "DefaultTargetCapacityType": kind},
        }
        if market is Market.SPOT:
            params["SpotOptions"] = {"AllocationStrategy": "price-capacity-optimized",
                                     "InstanceInterruptionBehavior": "terminate", **options}
        else:
            params["OnDemandOptions"] = {"AllocationStrategy": "prioritized", **options}
        log.info("aws.fleet", market=kind, count=n, placement_group=group or None,
                 shapes=[f"{s.instance.sdk_machine_type}/{s.zone or '*'}" for s in shapes])
        answer = p._call(region, "", "create_fleet", **params)
    finally:
        for name in templates:
            try:
                p._call(region, "", "delete_launch_template", LaunchTemplateName=name)
            except ProviderError as e:  # a leftover template costs nothing; the next attempt has its own
                log.warning("aws.fleet.template_left", template=name, code=e.code)
    ids = [i for item in answer.get("Instances") or [] for i in item.get("InstanceIds") or []]
    if not ids:
        for err in answer.get("Errors") or []:
            over = (err.get("LaunchTemplateAndOverrides") or {}).get("Overrides") or {}
            which = _matching(p, spec, shapes, over)
            refused = code_error(str(err.get("ErrorCode") or ""), str(err.get("ErrorMessage") or ""),
                                 region=region, zone=which.zone if which else str(over.get("AvailabilityZone") or ""))
            if which is not None and all(which is not f for f, _ in failures):
                failures.append((which, refused))
        log.warning("aws.fleet.none", market=kind, errors=[e.code for _, e in failures])
        return None
    raw = sorted(p._describe(region, [{"Name": "instance-id", "Values": ids}]), key=_launch_order)
    up = [r for r in raw if r["State"]["Name"] in _LIVE]
    zone = (raw[0].get("Placement") or {}).get("AvailabilityZone", "") if raw else ""
    if len(up) < n or len(ids) < n:
        code = next(((r.get("StateReason") or {}).get("Code") or "" for r in raw
                     if r["State"]["Name"] not in _LIVE), "") or "PartialLaunch"
        p._discard(region, zone, raw, log)
        if group:
            p._delete_placement_group(region, group)
        raise PartialFulfilment(f"EC2 Fleet launched {len(up)} live of {n} instances ({code}); terminated them",
                                got=len(up), wanted=n, provider=PROVIDER, code=code, region=region, zone=zone)
    got = p._name_nodes(spec, up, zone)
    shape = next((s for s in shapes if all(s.matches(i) for i in got)), None)
    if shape is None:
        p._discard(region, zone, up, log)
        raise InvalidRequestError(f"EC2 Fleet launched {got[0].instance_type} in {zone}, which no shape asked for",
                                  provider=PROVIDER, code="ShapeMismatch", region=region, zone=zone)
    log.info("aws.fleet.launched", zone=zone, instance_type=got[0].instance_type, market=kind,
             instance_ids=[i.instance_id for i in got])
    return shape, got


def _override(p: "AwsProvider", spec: LaunchSpec, s: Shape, rank: int) -> dict[str, Any]:
    out: dict[str, Any] = {"InstanceType": s.instance.sdk_machine_type, "Priority": float(rank)}
    subnet = p._subnet(spec.region, s.zone) if s.zone else p._subnet(spec.region, "")
    if subnet:
        out["SubnetId"] = subnet
    elif s.zone:
        out["AvailabilityZone"] = s.zone
    if s.market is Market.SPOT and spec.max_price_micros > 0:
        out["MaxPrice"] = _price(spec.max_price_micros)
    return out


def _matching(p: "AwsProvider", spec: LaunchSpec, shapes: Sequence[Shape], over: dict) -> Shape | None:
    """The shape an override of the answer stands for."""
    for rank, s in enumerate(shapes):
        if over.get("Priority") is not None and float(over["Priority"]) == float(rank) \
                and over.get("InstanceType") == s.instance.sdk_machine_type:
            return s
    for s in shapes:
        if over.get("InstanceType") == s.instance.sdk_machine_type and \
                (not s.zone or over.get("AvailabilityZone") in (None, s.zone)):
            return s
    return None


def _template_data(p: "AwsProvider", spec: LaunchSpec, zone: str, group: str) -> dict[str, Any]:
    """``LaunchTemplateData``: what RunInstances would be given, less what the Fleet decides."""
    run = p._run_params(spec, zone, group, None, "")
    data = {k: v for k, v in run.items() if k not in _NOT_IN_TEMPLATE}
    if "UserData" in data:  # RunInstances' is encoded by boto3; a template's is given encoded
        data["UserData"] = base64.b64encode(data["UserData"].encode()).decode()
    if run.get("SecurityGroupIds"):
        data["SecurityGroupIds"] = run["SecurityGroupIds"]
    if "NetworkInterfaces" in data:  # each override names its zone's subnet
        data["NetworkInterfaces"] = [{k: v for k, v in nic.items() if k != "SubnetId"}
                                     for nic in data["NetworkInterfaces"]]
    if group:
        data["Placement"] = {"GroupName": group}
    return data
