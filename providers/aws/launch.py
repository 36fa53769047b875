"""Launching a lease on EC2: one all-or-nothing ``RunInstances`` per lease, idempotent through the
lease tag and ``ClientToken``, with its zone, subnet, placement group, market and reservation."""
from __future__ import annotations

import dataclasses
import hashlib
import re
from typing import Any, Mapping, Self, Sequence


from providers.aws.client import _log
from providers.aws.errors import PROVIDER, map_error
from providers.aws.errors import AWS_ERRORS
from providers.aws.blocks import CapacityBlocks
from providers.aws.fabric import efa_interfaces, ensure_fabric_group, vpc_of
from providers.aws.inventory import Ec2Inventory, _launch_order, placement_group_name
from providers.aws.names import CLIENT_TOKEN_LIMIT, _price, client_token
from providers.base import (
    TAG_LEASE,
    TAG_OWNER,
    CapacityError,
    Fabric,
    Instance,
    InvalidRequestError,
    LaunchSpec,
    Market,
    ProviderError,
    Scope,
    Shape,
    TransientError,
)
from providers.aws.settings import AwsSettings
from providers.settings import provider_table

USER_DATA_LIMIT = 16 * 1024  # bytes, before base64 (EC2's limit)
_LIVE = ("pending", "running")
_CR_RE = re.compile(r"cr-[0-9a-f]{8,17}\Z")


class AwsProvider(Ec2Inventory, CapacityBlocks):
    """:class:`providers.base.Provider` for AWS EC2."""

    @classmethod
    def from_config(cls, settings: AwsSettings | Mapping[str, Any], owner: str) -> Self:
        """From the typed ``[providers.aws]`` settings (or a raw table, checked by the schema)."""
        return cls(provider_table(AwsSettings, PROVIDER, settings), owner)

    def notice_source(self) -> Any:
        """The interruption queue (:class:`providers.aws.interruptions.SqsNotices`) when
        ``interruption_queue_url`` is set, else None."""
        if not self.settings.interruption_queue_url:
            return None
        from providers.aws.interruptions import SqsNotices

        return SqsNotices(self, self.settings.interruption_queue_url, self.settings.interruption_wait_s)

    # -- launching ----------------------------------------------------------------------------

    def launch(self, spec: LaunchSpec) -> list[Instance]:
        """Start ``spec.count`` nodes in one zone, all or nothing; idempotent on the lease."""
        self._check(spec)
        region = spec.region
        log = _log.bind(provider=PROVIDER, lease_id=spec.lease_id, region=region)
        found = sorted(self._describe(region, self._mine(spec.lease_id)), key=_launch_order)
        live = [r for r in found if r["State"]["Name"] in _LIVE]
        dead = [r for r in found if r["State"]["Name"] not in _LIVE]
        if live:
            return self._adopt(spec, live, dead, log)

        reservation = self._reservation(spec) if spec.market is Market.RESERVED else None
        zone = self._zone(spec, reservation)
        group = ""
        if spec.count > 1:
            # A gang shares one cluster placement group, inside a capacity reservation too.
            group = self._ensure_placement_group(spec, zone)
        token = client_token(spec)
        consumed = sorted(r["InstanceId"] for r in dead if r.get("ClientToken") == token)
        if consumed:
            # Every instance this token launched has stopped (an interruption, a teardown): EC2 would
            # answer the token with those dead instances, so the relaunch gets a token derived from
            # them, which is just as stable across retries.
            token = "r-" + hashlib.sha256("\n".join([token, *consumed]).encode()).hexdigest()[: CLIENT_TOKEN_LIMIT - 2]
            log.info("aws.launch.relaunch", stopped_instance_ids=consumed)
        params = self._run_params(spec, zone, group, reservation, token)
        log.info("aws.launch", zone=zone, instance_type=spec.instance.sdk_machine_type,
                 market=str(spec.market), count=spec.count, placement_group=group or None)
        try:
            response = self._call(region, zone, "run_instances", **params)
        except ProviderError as e:
            log.warning("aws.launch.failed", zone=zone, code=e.code, error_type=type(e).__name__,
                        scope=str(e.scope))
            if group:
                self._delete_placement_group(region, group)
            raise
        made = sorted(response.get("Instances", []), key=_launch_order)
        reused = {r["InstanceId"] for r in dead} & {r["InstanceId"] for r in made}
        if reused:
            raise InvalidRequestError(
                f"client token {spec.client_token!r} already launched instances that have since stopped; "
                "a new launch attempt needs a new client token",
                provider=PROVIDER, code="IdempotentTokenConsumed", region=region, zone=zone)
        if len(made) < spec.count:
            self._discard(region, zone, made, log)
            raise CapacityError(f"EC2 started {len(made)} of {spec.count} instances",
                                provider=PROVIDER, code="PartialLaunch", region=region, zone=zone)
        instances = self._name_nodes(spec, made, zone)
        log.info("aws.launched", zone=zone, instance_ids=[i.instance_id for i in instances])
        return instances

    def launch_shapes(self, spec: LaunchSpec, shapes: Sequence[Shape]) -> tuple[Shape, list[Instance]]:
        """The first of ``shapes`` EC2 has capacity for, in one Fleet ``instant`` request per market
        (see :mod:`providers.aws.fleet`); one shape is :meth:`launch`."""
        from providers.aws.fleet import launch_shapes

        return launch_shapes(self, spec, shapes)

    def _check(self, spec: LaunchSpec) -> None:
        def bad(msg: str, code: str, scope: Scope = Scope.OFFER) -> InvalidRequestError:
            return InvalidRequestError(msg, provider=PROVIDER, code=code, scope=scope,
                                       region=spec.region, zone=spec.zone)

        if spec.provider != PROVIDER:
            raise bad(f"launch spec is for provider {spec.provider!r}, not aws", "WrongProvider", Scope.CLOUD)
        if spec.count < 1 or len(spec.node_names) != spec.count:
            raise bad(f"launch spec asks for {spec.count} nodes but names {len(spec.node_names)}", "BadNodeCount")
        if len(set(spec.node_names)) != spec.count or not all(spec.node_names):
            raise bad("node names must be non-empty and distinct", "BadNodeNames")
        if not spec.lease_id:
            raise bad("launch spec has no lease id", "NoLeaseId")
        if not self.settings.image_for(spec.region):
            raise bad(f"no AMI configured for region {spec.region}", "NoImageForRegion", Scope.REGION)
        if len(spec.boot_script.encode()) > USER_DATA_LIMIT:
            raise bad(f"boot script is {len(spec.boot_script.encode())} bytes; EC2 user data holds "
                      f"{USER_DATA_LIMIT}", "UserDataTooLarge", Scope.CLOUD)
        if spec.market is Market.RESERVED and not spec.reservation:
            raise bad("a reserved launch needs spec.reservation", "NoReservation")
        if spec.market is Market.QUEUED:  # a Capacity Block is launched into once bought: reserved
            raise bad("a capacity block offering cannot be launched before it is bought", "CapacityBlockNotBought")

    def _adopt(self, spec: LaunchSpec, live: list[dict], dead: list[dict], log: Any) -> list[Instance]:
        region = spec.region
        zone = (live[0].get("Placement") or {}).get("AvailabilityZone", "")
        if len(live) >= spec.count:
            log.info("aws.launch.adopted", zone=zone, instance_ids=[r["InstanceId"] for r in live])
            return self._name_nodes(spec, live, zone)
        if not dead:
            # EC2's reads are eventually consistent: the rest of the launch may not be listed yet.
            raise TransientError(
                f"lease {spec.lease_id} shows {len(live)} of {spec.count} instances; retry to see the rest",
                provider=PROVIDER, code="IncompleteView", region=region, zone=zone)
        code = (dead[0].get("StateReason") or {}).get("Code") or "PartialLaunch"
        log.warning("aws.launch.partial", zone=zone, live=len(live), wanted=spec.count, code=code)
        self._discard(region, zone, live + [r for r in dead if r["State"]["Name"] in ("stopping", "stopped")], log)
        raise CapacityError(
            f"lease {spec.lease_id} kept {len(live)} of {spec.count} instances ({code}); terminated the rest",
            provider=PROVIDER, code=code, region=region, zone=zone)

    def _discard(self, region: str, zone: str, raw: list[dict], log: Any) -> None:
        ids = [r["InstanceId"] for r in raw]
        if ids:
            log.warning("aws.launch.discard", zone=zone, instance_ids=ids)
            self._terminate_region(region, ids)

    def _name_nodes(self, spec: LaunchSpec, raw: list[dict], zone: str) -> list[Instance]:
        """Give each node its ``Name`` tag (in launch order) and return them as instances."""
        instances = [self.to_instance(spec.region, r) for r in raw]
        taken = {i.node_name for i in instances if i.node_name in spec.node_names}
        free = iter(n for n in spec.node_names if n not in taken)
        out = []
        for inst in instances:
            if inst.node_name not in spec.node_names:
                name = next(free, "")
                if name:
                    self._call(spec.region, zone, "create_tags", Resources=[inst.instance_id],
                               Tags=[{"Key": "Name", "Value": name}])
                    inst = _replace(inst, node_name=name)
            out.append(inst)
        return sorted(out, key=lambda i: (spec.node_names.index(i.node_name)
                                          if i.node_name in spec.node_names else len(spec.node_names)))

    def _tags(self, spec: LaunchSpec) -> list[dict[str, str]]:
        reserved = {TAG_LEASE, TAG_OWNER, "Name"}
        tags = {str(k): str(v) for k, v in spec.tags.items() if str(k) not in reserved}
        tags.update({TAG_LEASE: spec.lease_id, TAG_OWNER: self.owner})
        return [{"Key": k, "Value": v} for k, v in tags.items()]

    def _run_params(self, spec: LaunchSpec, zone: str, group: str,
                    reservation: Mapping[str, Any] | None, token: str) -> dict[str, Any]:
        region = spec.region
        tags = self._tags(spec)
        instance_tags = tags + ([{"Key": "Name", "Value": spec.node_names[0]}] if spec.count == 1 else [])
        params: dict[str, Any] = {
            "ImageId": self.settings.image_for(region),
            "InstanceType": spec.instance.sdk_machine_type,
            "MinCount": spec.count,
            "MaxCount": spec.count,
            "ClientToken": token,
            "TagSpecifications": [
                {"ResourceType": "instance", "Tags": instance_tags},
                {"ResourceType": "volume", "Tags": tags},
            ],
            # Instance tags in the metadata service: each node of a gang reads its own Name at boot.
            "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled",
                                "InstanceMetadataTags": "enabled"},
            "InstanceInitiatedShutdownBehavior": "terminate",
        }
        placement: dict[str, str] = {}
        if zone:
            placement["AvailabilityZone"] = zone
        if group:
            placement["GroupName"] = group
        if placement:
            params["Placement"] = placement
        params.update(self._network_params(spec, zone))
        if self.settings.key_name:
            params["KeyName"] = self.settings.key_name
        profile = self.settings.iam_instance_profile
        if profile:
            params["IamInstanceProfile"] = {"Arn": profile} if profile.startswith("arn:") else {"Name": profile}
        if self.settings.root_volume_gb:
            params["BlockDeviceMappings"] = [{
                "DeviceName": self._root_device(region, params["ImageId"]),
                "Ebs": {"VolumeSize": self.settings.root_volume_gb, "VolumeType": "gp3",
                        "DeleteOnTermination": True},
            }]
        if spec.boot_script:
            params["UserData"] = spec.boot_script  # boto3 base64-encodes it
        if spec.market is Market.SPOT:
            options: dict[str, str] = {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}
            if spec.max_price_micros > 0:
                options["MaxPrice"] = _price(spec.max_price_micros)
            params["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": options}
        elif spec.market is Market.RESERVED:
            if spec.reservation.startswith("arn:"):
                target = {"CapacityReservationResourceGroupArn": spec.reservation}
            else:
                target = {"CapacityReservationId": spec.reservation}
            params["CapacityReservationSpecification"] = {"CapacityReservationTarget": target}
            if reservation and reservation.get("ReservationType") == "capacity-block":
                params["InstanceMarketOptions"] = {"MarketType": "capacity-block"}
        return params

    def _network_params(self, spec: LaunchSpec, zone: str) -> dict[str, Any]:
        """Subnet and security groups; for a multi-node gang of an EFA type, its EFA interfaces
        (which carry the subnet and groups themselves: EC2 refuses both at once)."""
        region = spec.region
        subnet = self._subnet(region, zone)
        groups = list(self.settings.security_groups_for(region))
        if spec.instance.fabric_for(spec.count) is Fabric.EFA:
            def call(op: str, **kw: Any) -> dict[str, Any]:
                return self._call(region, zone, op, **kw)

            vpc = self._cached(("vpc", region, subnet), lambda: vpc_of(call, subnet))
            fabric_group = self._cached(("fabric-group", region, vpc),
                                        lambda: ensure_fabric_group(call, self.owner, vpc))
            return {"NetworkInterfaces": efa_interfaces(spec.instance.fabric_nics, subnet,
                                                        [fabric_group, *groups])}
        out: dict[str, Any] = {}
        if subnet:
            out["SubnetId"] = subnet
        if groups:
            out["SecurityGroupIds"] = groups
        return out

    def _reservation(self, spec: LaunchSpec) -> dict[str, Any] | None:
        """The targeted Capacity Reservation (None for a resource group ARN)."""
        if spec.reservation.startswith("arn:"):
            return None
        if not _CR_RE.match(spec.reservation):
            raise InvalidRequestError(f"{spec.reservation!r} is not a capacity reservation id or group ARN",
                                      provider=PROVIDER, code="InvalidCapacityReservationId.Malformed",
                                      region=spec.region, zone=spec.zone)
        found = self._call(spec.region, spec.zone, "describe_capacity_reservations",
                           CapacityReservationIds=[spec.reservation]).get("CapacityReservations", [])
        if not found:
            raise InvalidRequestError(f"capacity reservation {spec.reservation} does not exist",
                                      provider=PROVIDER, code="InvalidCapacityReservationId.NotFound",
                                      region=spec.region, zone=spec.zone)
        return found[0]

    def _zone(self, spec: LaunchSpec, reservation: Mapping[str, Any] | None) -> str:
        """``spec.zone``, else the reservation's zone, else the first configured zone offering the type."""
        if spec.zone:
            return spec.zone
        if reservation and reservation.get("AvailabilityZone"):
            return str(reservation["AvailabilityZone"])
        region = spec.region
        subnet = self.settings.subnet_ids.get(region)
        if isinstance(subnet, Mapping):
            candidates = sorted(subnet)
        elif region in self.settings.zones:
            candidates = list(self.settings.zones[region])
        elif isinstance(subnet, str):
            candidates = [self._subnet_zone(region, subnet)]
        else:
            candidates = self._region_zones(region)
        if len(candidates) > 1:
            offered = self._zones_offering(region, spec.instance.sdk_machine_type)
            preferred = [z for z in candidates if z in offered]
            if preferred:
                return preferred[0]
        return candidates[0] if candidates else ""

    def _subnet(self, region: str, zone: str) -> str:
        subnet = self.settings.subnet_ids.get(region)
        if isinstance(subnet, Mapping):
            if zone not in subnet:
                raise InvalidRequestError(f"no subnet configured for zone {zone}", provider=PROVIDER,
                                          code="NoSubnetForZone", region=region, zone=zone)
            return subnet[zone]
        return subnet or ""

    def _region_zones(self, region: str) -> list[str]:
        def compute() -> list[str]:
            zones = self._call(region, "", "describe_availability_zones").get("AvailabilityZones", [])
            return sorted(
                z["ZoneName"] for z in zones
                if z.get("State", "available") == "available"
                and z.get("ZoneType", "availability-zone") == "availability-zone"
                and z.get("OptInStatus", "opt-in-not-required") in ("opt-in-not-required", "opted-in")
            )
        return self._cached(("zones", region), compute)

    def _zones_offering(self, region: str, instance_type: str) -> set[str]:
        def compute() -> set[str]:
            pages = self.client(region).get_paginator("describe_instance_type_offerings").paginate(
                LocationType="availability-zone",
                Filters=[{"Name": "instance-type", "Values": [instance_type]}])
            try:
                return {o["Location"] for p in pages for o in p.get("InstanceTypeOfferings", [])}
            except AWS_ERRORS as e:
                raise map_error(e, region=region) from e
        return self._cached(("offered", region, instance_type), compute)

    def _subnet_zone(self, region: str, subnet: str) -> str:
        def compute() -> str:
            subnets = self._call(region, "", "describe_subnets", SubnetIds=[subnet]).get("Subnets", [])
            return subnets[0]["AvailabilityZone"] if subnets else ""
        return self._cached(("subnet", region, subnet), compute)

    def _root_device(self, region: str, image_id: str) -> str:
        def compute() -> str:
            images = self._call(region, "", "describe_images", ImageIds=[image_id]).get("Images", [])
            if not images:
                raise InvalidRequestError(f"image {image_id} not found", provider=PROVIDER,
                                          code="InvalidAMIID.NotFound", scope=Scope.REGION, region=region)
            return images[0].get("RootDeviceName") or "/dev/xvda"
        return self._cached(("root", region, image_id), compute)

    def _ensure_placement_group(self, spec: LaunchSpec, zone: str) -> str:
        name = placement_group_name(spec.lease_id)
        try:
            self._call(spec.region, zone, "create_placement_group", GroupName=name, Strategy="cluster",
                       TagSpecifications=[{"ResourceType": "placement-group", "Tags": self._tags(spec)}])
        except InvalidRequestError as e:
            if e.code != "InvalidPlacementGroup.Duplicate":
                raise
        return name


def _replace(inst: Instance, **changes: Any) -> Instance:
    return dataclasses.replace(inst, **changes)
