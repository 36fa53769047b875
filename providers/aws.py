"""AWS: GPU instances on EC2 through boto3.

One ``launch`` is one ``RunInstances`` call with ``MinCount = MaxCount = count``: EC2 starts all
of the lease's nodes or none. ``ClientToken`` carries ``spec.client_token`` (hashed when longer
than EC2's 64 characters), and before launching the provider looks the lease up by its
``broker:lease`` tag, so a retry after a crash or a timeout returns what the first call made.
Multi-node leases go into a cluster placement group named ``broker-<lease id>``, created on
demand and deleted once its instances are terminated. Spot uses ``InstanceMarketOptions``
(one-time, terminate on interruption, ``MaxPrice`` when ``spec.max_price_micros`` is set);
reserved capacity targets ``spec.reservation`` (a ``cr-`` Capacity Reservation id, including
Capacity Blocks for ML, or a reservation resource group ARN). The boot script is the instance's
user data. Nodes carry the tags ``broker:lease``, ``broker:owner``, ``Name`` and ``spec.tags``;
their root volumes carry the lease and owner tags too.

Interruptions: EC2 reports a reclaimed spot instance as ``shutting-down`` / ``terminated`` with
the state reason ``Server.SpotInstanceTermination``, which :meth:`AwsProvider.describe` maps to
``StopReason.INTERRUPTED`` (``stop_detail`` holds the code). The two-minute interruption notice
and rebalance recommendations are only visible from inside the instance (IMDS) or through
EventBridge, not through the EC2 API, so they are not reported here. Terminated instances stay
visible for about an hour; after that a spot node simply vanishes from ``describe``, and the
lifecycle treats a vanished spot instance of a live lease as interrupted.

Errors: every botocore exception becomes exactly one ``providers.base`` error carrying EC2's own
code. The SDK makes a single attempt per call (no botocore retries): EC2 answers capacity
shortages with HTTP 500, which botocore would otherwise retry for seconds, and failover across
zones, regions and clouds is decided above, in the broker's lifecycle.

Credentials come from boto3's standard chain (environment, shared files, SSO, instance or
container role) and are never logged. ``credentials = "anonymous"`` is accepted only with an
``endpoint_url`` on loopback (an emulator): requests are then signed with a fixed placeholder
key, because emulators such as moto route a request to its region by the signature's scope.

IAM actions needed::

    ec2:RunInstances              ec2:CreateTags (on instance and volume, for RunInstances
    ec2:DescribeInstances                         and for naming the nodes afterwards)
    ec2:TerminateInstances        ec2:CreatePlacementGroup, ec2:DeletePlacementGroup
    ec2:DescribeAvailabilityZones ec2:DescribeInstanceTypeOfferings
    ec2:DescribeSubnets           (when a region's subnet is configured without its zone)
    ec2:DescribeImages            (when root_volume_gb is set)
    ec2:DescribeCapacityReservations (reserved launches)
    iam:PassRole                  (when iam_instance_profile is set)
    iam:CreateServiceLinkedRole   (once per account, for AWSServiceRoleForEC2Spot)

Settings (``[providers.aws]``): ``enabled``, ``regions`` (list, required), ``image_id`` (an AMI
id, or a table region -> AMI id; required), ``endpoint_url``, ``credentials``
(``"default"`` | ``"anonymous"``), ``subnet_ids`` (table region -> subnet id, or region ->
table zone -> subnet id), ``zones`` (table region -> list of zones to prefer),
``security_group_ids`` (list, or table region -> list), ``key_name``, ``iam_instance_profile``
(name or ARN), ``root_volume_gb``, ``connect_timeout_s`` (default 5), ``read_timeout_s``
(default 30), ``terminate_timeout_s`` (default 600).
"""
from __future__ import annotations

import dataclasses
import hashlib
import re
import threading
from decimal import Decimal
from typing import Any, Iterable, Iterator, Mapping, Self, Sequence

import boto3
import botocore.exceptions as bce
import botocore.loaders
import botocore.session
import structlog
import tenacity
from botocore.config import Config

from providers.settings import AwsSettings, provider_settings
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

PROVIDER = "aws"
_log = structlog.get_logger()

USER_DATA_LIMIT = 16 * 1024  # bytes, before base64 (EC2's limit)
CLIENT_TOKEN_LIMIT = 64
PLACEMENT_GROUP_PREFIX = "broker-"
_LIVE = ("pending", "running")
_NOT_TERMINATED = ("pending", "running", "shutting-down", "stopping", "stopped")

_STATES = {
    "pending": InstanceState.PENDING,
    "running": InstanceState.RUNNING,
    "shutting-down": InstanceState.STOPPING,
    "stopping": InstanceState.STOPPING,
    "stopped": InstanceState.STOPPING,
    "terminated": InstanceState.TERMINATED,
}

# EC2 state-reason codes (``StateReason.Code``) -> why the instance stopped.
_STOP_REASONS = {
    "Server.SpotInstanceTermination": StopReason.INTERRUPTED,
    "Server.SpotInstanceShutdown": StopReason.INTERRUPTED,
    "Server.InsufficientInstanceCapacity": StopReason.CAPACITY,
    "Client.UserInitiatedShutdown": StopReason.USER,
    "Client.InstanceInitiatedShutdown": StopReason.USER,
    "Client.UserInitiatedHibernate": StopReason.USER,
    "Server.ScheduledStop": StopReason.ERROR,
    "Server.InternalError": StopReason.ERROR,
    "Client.InternalError": StopReason.ERROR,
    "Client.VolumeLimitExceeded": StopReason.ERROR,
    "Client.InvalidSnapshot.NotFound": StopReason.ERROR,
}

# EC2 error codes -> error class and scope. Codes not listed fall back on their family below.
_CAPACITY = {
    "InsufficientInstanceCapacity": Scope.ZONE,
    "InsufficientCapacity": Scope.ZONE,
    "InsufficientHostCapacity": Scope.ZONE,
    "InsufficientCapacityOnHost": Scope.ZONE,
    "InsufficientReservedInstanceCapacity": Scope.ZONE,
    "ReservationCapacityExceeded": Scope.OFFER,
    "SpotMaxPriceTooLow": Scope.OFFER,
}
_QUOTA = {
    "InstanceLimitExceeded", "VcpuLimitExceeded", "MaxSpotInstanceCountExceeded",
    "VolumeLimitExceeded", "MaxIOPSLimitExceeded", "ResourceLimitExceeded",
    "InsufficientFreeAddressesInSubnet",
}
_THROTTLE = {
    "RequestLimitExceeded", "Throttling", "ThrottlingException", "RequestThrottled",
    "TooManyRequestsException", "SlowDown", "EC2ThrottledException",
}
_AUTH = {
    "UnauthorizedOperation": Scope.CLOUD, "AuthFailure": Scope.CLOUD,
    "InvalidClientTokenId": Scope.CLOUD, "SignatureDoesNotMatch": Scope.CLOUD,
    "ExpiredToken": Scope.CLOUD, "RequestExpired": Scope.CLOUD,
    "MissingAuthenticationToken": Scope.CLOUD, "AccessDenied": Scope.CLOUD,
    "AccessDeniedException": Scope.CLOUD, "UnrecognizedClientException": Scope.CLOUD,
    "Blocked": Scope.CLOUD, "OptInRequired": Scope.REGION, "PendingVerification": Scope.REGION,
}
_TRANSIENT = {
    "InternalError", "InternalFailure", "ServiceUnavailable", "Unavailable",
    "ServiceUnavailableException", "RequestTimeout", "RequestTimeoutException",
}
# Invalid-request codes that are about the region's configuration rather than one offer.
_INVALID_REGION_PREFIXES = (
    "InvalidAMIID", "InvalidSubnetID", "InvalidGroup", "InvalidKeyPair", "InvalidSecurityGroupID",
    "InvalidVpcID",
)

_CR_RE = re.compile(r"cr-[0-9a-f]{8,17}\Z")


# ---------------------------------------------------------------------------------------------
# Error mapping


def map_error(exc: BaseException, *, region: str = "", zone: str = "") -> ProviderError:
    """The one ``providers.base`` error for a botocore exception (``code`` is EC2's own)."""
    where = {"provider": PROVIDER, "region": region, "zone": zone}
    if isinstance(exc, ProviderError):
        return exc
    if isinstance(exc, bce.ClientError):
        err = exc.response.get("Error", {}) or {}
        code = str(err.get("Code") or "")
        message = str(err.get("Message") or exc)
        status = int((exc.response.get("ResponseMetadata") or {}).get("HTTPStatusCode") or 0)
        if code in _CAPACITY:
            return CapacityError(message, code=code, scope=_CAPACITY[code], **where)
        if code in _QUOTA:
            return QuotaError(message, code=code, **where)
        if code in _THROTTLE or status == 429:
            return ThrottledError(message, code=code, **where)
        if code in _AUTH or status in (401, 403):
            return AuthError(message, code=code, scope=_AUTH.get(code, Scope.CLOUD), **where)
        if code in _TRANSIENT or status >= 500:
            return TransientError(message, code=code, **where)
        scope = Scope.REGION if code.startswith(_INVALID_REGION_PREFIXES) else Scope.OFFER
        return InvalidRequestError(message, code=code, scope=scope, **where)
    code = type(exc).__name__
    if isinstance(exc, (bce.NoCredentialsError, bce.PartialCredentialsError,
                        bce.CredentialRetrievalError, bce.TokenRetrievalError,
                        bce.UnauthorizedSSOTokenError, bce.NoAuthTokenError)):
        return AuthError(str(exc), code=code, **where)
    if isinstance(exc, bce.ParamValidationError):
        return InvalidRequestError(str(exc), code=code, **where)
    # Connection refused/reset, connect and read timeouts, unparseable answers, waiter failures.
    return TransientError(str(exc), code=code, **where)


# ---------------------------------------------------------------------------------------------
# The provider


def client_token(spec: LaunchSpec) -> str:
    """EC2's idempotency token for ``spec``: the broker's token when it fits, else its hash."""
    token = spec.client_token or f"lease-{spec.lease_id}"
    if len(token) <= CLIENT_TOKEN_LIMIT and token.isascii() and token.isprintable():
        return token
    return "h-" + hashlib.sha256(token.encode()).hexdigest()[: CLIENT_TOKEN_LIMIT - 2]


def placement_group_name(lease_id: str) -> str:
    return f"{PLACEMENT_GROUP_PREFIX}{lease_id}"[:255]


_loader_lock = threading.Lock()
_loader: botocore.loaders.Loader | None = None


def _session(anonymous: bool) -> boto3.session.Session:
    """A boto3 session whose service models come from one process-wide loader (parsing EC2's
    model takes most of a second; every provider built in this process shares it)."""
    global _loader
    with _loader_lock:
        if _loader is None:
            _loader = botocore.loaders.create_loader()
        core = botocore.session.get_session()
        core.register_component("data_loader", _loader)
    if anonymous:
        return boto3.session.Session(botocore_session=core, aws_access_key_id="anonymous",
                                     aws_secret_access_key="anonymous")
    return boto3.session.Session(botocore_session=core)


def _price(micros: int) -> str:
    return format(Decimal(micros).scaleb(-6).normalize(), "f")


class AwsProvider:
    """:class:`providers.base.Provider` for AWS EC2."""

    name = PROVIDER

    def __init__(self, settings: AwsSettings, owner: str, *, session: boto3.session.Session | None = None,
                 page_size: int = 500, poll_s: float = 5.0) -> None:
        if not owner or not isinstance(owner, str) or len(owner) > 256:
            raise ValueError("the broker owner id must be a non-empty string of at most 256 characters")
        self.settings = settings
        self.owner = owner
        self.page_size = max(5, min(1000, page_size))
        self.poll_s = poll_s
        self._session = session or _session(settings.anonymous)
        self._config = Config(
            connect_timeout=settings.connect_timeout_s,
            read_timeout=settings.read_timeout_s,
            retries={"mode": "standard", "total_max_attempts": 1},
            user_agent_extra="gpu-burst-broker",
            tcp_keepalive=True,
        )
        self._clients: dict[str, Any] = {}
        self._cache: dict[tuple, Any] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, settings: AwsSettings | Mapping[str, Any], owner: str) -> Self:
        """From the typed ``[providers.aws]`` settings (or a raw table, checked by the schema)."""
        return cls(provider_settings(PROVIDER, settings), owner)

    # -- plumbing -----------------------------------------------------------------------------

    def client(self, region: str) -> Any:
        """The EC2 client of ``region`` (created once; boto3 clients are thread-safe)."""
        with self._lock:
            c = self._clients.get(region)
            if c is None:
                c = self._session.client(
                    "ec2", region_name=region, config=self._config,
                    endpoint_url=self.settings.endpoint_url or None,
                )
                self._clients[region] = c
            return c

    def _call(self, region: str, zone: str, op: str, **kwargs: Any) -> dict[str, Any]:
        try:
            return getattr(self.client(region), op)(**kwargs)
        except (bce.BotoCoreError, bce.ClientError) as e:
            raise map_error(e, region=region, zone=zone) from e

    def _describe(self, region: str, filters: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        """Every instance matching ``filters`` in ``region``, through all result pages."""
        pages = self.client(region).get_paginator("describe_instances").paginate(
            Filters=filters, PaginationConfig={"PageSize": self.page_size})
        try:
            for page in pages:
                for reservation in page.get("Reservations", []):
                    yield from reservation.get("Instances", [])
        except (bce.BotoCoreError, bce.ClientError) as e:
            raise map_error(e, region=region) from e

    def _mine(self, lease_id: str | None = None) -> list[dict[str, Any]]:
        """Filters selecting this broker's instances (of one lease)."""
        filters = [{"Name": f"tag:{TAG_OWNER}", "Values": [self.owner]}]
        if lease_id is not None:
            filters.append({"Name": f"tag:{TAG_LEASE}", "Values": [lease_id]})
        return filters

    def _cached(self, key: tuple, compute: Any) -> Any:
        with self._lock:
            if key in self._cache:
                return self._cache[key]
        value = compute()
        with self._lock:
            self._cache[key] = value
        return value

    # -- reading ------------------------------------------------------------------------------

    def to_instance(self, region: str, raw: Mapping[str, Any]) -> Instance:
        """An EC2 ``Instance`` structure as the broker's :class:`Instance`."""
        tags = {t["Key"]: t["Value"] for t in raw.get("Tags") or []}
        state_name = (raw.get("State") or {}).get("Name", "pending")
        state = _STATES.get(state_name, InstanceState.PENDING)
        reason = StopReason.NONE
        detail = ""
        if state in (InstanceState.STOPPING, InstanceState.TERMINATED):
            detail = (raw.get("StateReason") or {}).get("Code") or ""
            reason = _STOP_REASONS.get(detail, StopReason.ERROR if detail else StopReason.USER)
        if raw.get("CapacityReservationId"):
            market = Market.RESERVED
        elif raw.get("InstanceLifecycle") == "spot":
            market = Market.SPOT
        else:
            market = Market.ON_DEMAND
        launched = raw.get("LaunchTime")
        return Instance(
            provider=PROVIDER,
            instance_id=raw["InstanceId"],
            region=region,
            zone=(raw.get("Placement") or {}).get("AvailabilityZone", ""),
            instance_type=raw.get("InstanceType", ""),
            market=market,
            state=state,
            lease_id=tags.get(TAG_LEASE, ""),
            node_name=tags.get("Name", ""),
            private_ip=raw.get("PrivateIpAddress") or "",
            stop_reason=reason,
            stop_detail=detail,
            launched_at=launched.timestamp() if hasattr(launched, "timestamp") else 0.0,
        )

    def describe(self, lease_id: str, region: str) -> list[Instance]:
        """The lease's instances in ``region``, terminated ones included while EC2 lists them."""
        raw = sorted(self._describe(region, self._mine(lease_id)), key=_launch_order)
        return [self.to_instance(region, r) for r in raw]

    def list_managed(self, regions: Sequence[str] | None = None) -> list[Instance]:
        """Every not-yet-terminated instance carrying this broker's owner tag."""
        out: list[Instance] = []
        for region in regions or self.settings.regions:
            filters = self._mine() + [{"Name": "instance-state-name", "Values": list(_NOT_TERMINATED)}]
            out.extend(self.to_instance(region, r) for r in self._describe(region, filters))
        return out

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
        if spec.count > 1 and spec.market is not Market.RESERVED:
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
        subnet = self._subnet(region, zone)
        if subnet:
            params["SubnetId"] = subnet
        groups = self.settings.security_groups_for(region)
        if groups:
            params["SecurityGroupIds"] = list(groups)
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
            except (bce.BotoCoreError, bce.ClientError) as e:
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

    def _delete_placement_group(self, region: str, name: str) -> None:
        """Best effort: an unknown or still-used group is left alone."""
        try:
            self._call(region, "", "delete_placement_group", GroupName=name)
        except ProviderError as e:
            _log.info("aws.placement_group.kept", provider=PROVIDER, region=region, group=name, code=e.code)

    # -- terminating --------------------------------------------------------------------------

    def terminate(self, instances: Sequence[Instance]) -> None:
        """Terminate ``instances`` and wait (bounded) until EC2 reports them terminated."""
        by_region: dict[str, list[str]] = {}
        for inst in instances:
            by_region.setdefault(inst.region, []).append(inst.instance_id)
        for region, ids in by_region.items():
            self._terminate_region(region, list(dict.fromkeys(ids)))

    def _terminate_region(self, region: str, ids: list[str]) -> None:
        groups: set[str] = set()
        leases: set[str] = set()
        for chunk in _chunks(ids, 200):
            current = list(self._describe(region, [{"Name": "instance-id", "Values": chunk}]))
            for r in current:
                group = (r.get("Placement") or {}).get("GroupName") or ""
                if group.startswith(PLACEMENT_GROUP_PREFIX):
                    groups.add(group)
                tags = {t["Key"]: t["Value"] for t in r.get("Tags") or []}
                if tags.get(TAG_LEASE):
                    leases.add(tags[TAG_LEASE])
            alive = [r["InstanceId"] for r in current if r["State"]["Name"] not in ("shutting-down", "terminated")]
            if alive:
                try:
                    self._call(region, "", "terminate_instances", InstanceIds=alive)
                except InvalidRequestError as e:
                    if not e.code.startswith("InvalidInstanceID.NotFound"):
                        raise
        _log.info("aws.terminate", provider=PROVIDER, region=region, instance_ids=ids,
                  lease_ids=sorted(leases))
        self._wait_terminated(region, ids)
        for group in sorted(groups):
            self._delete_placement_group(region, group)

    def _wait_terminated(self, region: str, ids: list[str]) -> None:
        def remaining() -> list[str]:
            left: list[str] = []
            for chunk in _chunks(ids, 200):
                left += [r["InstanceId"] for r in self._describe(region, [{"Name": "instance-id", "Values": chunk}])
                         if r["State"]["Name"] != "terminated"]
            return left

        try:
            tenacity.Retrying(
                stop=tenacity.stop_after_delay(self.settings.terminate_timeout_s),
                wait=tenacity.wait_fixed(self.poll_s),
                retry=tenacity.retry_if_result(bool),
                reraise=True,
            )(remaining)
        except tenacity.RetryError as e:
            left = e.last_attempt.result()
            raise TransientError(
                f"{len(left)} instance(s) not terminated after {self.settings.terminate_timeout_s:.0f}s: "
                f"{', '.join(left[:10])}", provider=PROVIDER, code="TerminateTimeout", region=region) from None


def _launch_order(raw: Mapping[str, Any]) -> tuple:
    launched = raw.get("LaunchTime")
    return (launched.timestamp() if hasattr(launched, "timestamp") else 0.0,
            raw.get("AmiLaunchIndex", 0), raw.get("InstanceId", ""))


def _chunks(items: Sequence[str], size: int) -> Iterable[list[str]]:
    for i in range(0, len(items), size):
        yield list(items[i:i + size])


def _replace(inst: Instance, **changes: Any) -> Instance:
    return dataclasses.replace(inst, **changes)
