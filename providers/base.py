"""The provider protocol, the values it speaks in, and the errors every cloud maps onto.

Money is integer micro-dollars (``*_micros``) everywhere below ``broker``'s output layer:
exact, fast to add, and converted to :class:`decimal.Decimal` only for display.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

MICROS = 1_000_000

class Market(str, enum.Enum):
    """How capacity is bought."""

    ON_DEMAND = "on_demand"
    SPOT = "spot"
    RESERVED = "reserved"
    # Queued capacity: bought ahead for a start time the cloud names (AWS Capacity Blocks for ML)
    # or granted when capacity frees (GCP flex-start), for at most a fixed run time.
    QUEUED = "queued"

    def __str__(self) -> str:  # "spot", not "Market.SPOT"
        return self.value


class Fabric(str, enum.Enum):
    """The node-to-node network an instance type is sold with (the catalog's ``interconnect``)."""

    EFA = "efa"  # AWS Elastic Fabric Adapter: one EFA per network card
    TCPX = "tcpx"  # GCP A3 High: gVNIC plus GPUDirect-TCPX NICs
    TCPXO = "tcpxo"  # GCP A3 Mega: gVNIC plus GPUDirect-TCPXO NICs
    INFINIBAND = "infiniband"  # Azure ND: InfiniBand HCAs, wired by the size and image
    ETHERNET = "ethernet"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class InstanceType:
    """A GPU machine shape of one provider (the same in every region that sells it)."""

    provider: str
    name: str
    gpu: str  # model: "H100", "A100", "A10G", "L4", "L40S", "T4", "V100", "H200", ...
    gpus: int  # GPUs per node
    gpu_memory_gb: int  # per GPU
    vcpus: int
    ram_gb: int
    interconnect: str  # "efa", "tcpx", "tcpxo", "infiniband", "ethernet"
    interconnect_gbps: int  # node-to-node bandwidth for multi-node jobs
    # GCP N1 shapes carry their GPUs as attachments ("nvidia-tesla-t4"); empty elsewhere.
    accelerator_type: str = ""
    # The SDK's name when it differs from the catalog name (GCP N1 + attachment rows).
    machine_type: str = ""
    # Network cards carrying the fabric: AWS EFA network cards, GCP GPU NICs besides the host's
    # gVNIC, Azure InfiniBand HCAs; 0 for Ethernet.
    fabric_nics: int = 0

    @property
    def sdk_machine_type(self) -> str:
        return self.machine_type or self.name

    @property
    def fabric(self) -> Fabric:
        """The fabric the type is sold with; Ethernet for unknown names or a type without NICs."""
        try:
            kind = Fabric(self.interconnect)
        except ValueError:
            return Fabric.ETHERNET
        return kind if self.fabric_nics > 0 else Fabric.ETHERNET

    @property
    def fabric_gbps(self) -> int:
        """Node-to-node bandwidth a gang launch of this type really gets: the catalog's figure when
        the type is plain Ethernet or its fabric NICs are known (the launch wires them), else 0."""
        if self.interconnect == Fabric.ETHERNET.value or self.fabric is not Fabric.ETHERNET:
            return self.interconnect_gbps
        return 0

    def fabric_for(self, nodes: int) -> Fabric:
        """The fabric a launch of ``nodes`` nodes wires up: only a multi-node gang needs one."""
        return self.fabric if nodes > 1 else Fabric.ETHERNET


@dataclass(frozen=True, slots=True)
class Offering:
    """One purchasable (provider, region, instance type, market) at a list price."""

    instance: InstanceType
    region: str
    zones: tuple[str, ...]
    market: Market
    hourly_micros: int  # per node
    sla_pct: float
    as_of: str
    source: str
    # For reserved offerings: the reservation's id/name in the cloud, and how many nodes it holds.
    reservation: str = ""
    reserved_nodes: int = 0
    # Where the price comes from ("bundled:2025-06-01", "aws:spot_price_history") and whether it
    # is older than the catalog's maximum age.
    price_source: str = ""
    stale: bool = False
    # Spot interruptions per node-hour for this offering (< 0: the provider's catalog rate), and
    # which signal gave it ("aws:spot_placement_score", "observed", "catalog").
    spot_rate: float = -1.0
    spot_rate_source: str = ""
    # The account quota this offering draws on: what is left and the limit (< 0: unknown), in
    # the quota's unit per node, and its name ("H100 GPUs", "P on-demand vCPUs").
    quota_left: float = -1.0
    quota_limit: float = 0.0
    quota_per_node: float = 0.0
    quota_label: str = ""
    # Queued offerings only: the earliest start (epoch seconds; 0 = none named) or, where the
    # cloud names none, the expected wait from the quote's time; the longest run the capacity
    # allows (hours); the fee paid up front for the whole block (0 = paid per hour as it runs)
    # and the cloud's id of the offering (AWS CapacityBlockOfferingId).
    starts_at: float = 0.0
    wait_s: float = 0.0
    max_run_h: float = 0.0
    upfront_micros: int = 0
    offer_id: str = ""

    @property
    def provider(self) -> str:
        return self.instance.provider

    def start_after(self, now: float) -> float:
        """When capacity of this offering is expected at the earliest, seen at ``now``."""
        return max(now + self.wait_s, self.starts_at)


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """Everything a provider needs to launch the nodes of one lease, all-or-nothing."""

    lease_id: str
    provider: str
    region: str
    zone: str  # may be "" to let the provider pick (the first configured zone of the region)
    instance: InstanceType
    market: Market
    count: int
    # Idempotency token sent to the cloud (AWS ClientToken, GCP requestId, Azure VM names).
    client_token: str
    node_names: tuple[str, ...]
    boot_script: str = ""  # rendered; may hold secrets: never log it
    tags: Mapping[str, str] = field(default_factory=dict)
    reservation: str = ""  # capacity reservation id / name / group when market is RESERVED
    max_price_micros: int = 0  # spot bid cap (0 = up to on-demand)
    max_run_h: float = 0.0  # queued capacity: the longest the nodes may run (GCP maxRunDuration)


@dataclass(frozen=True, slots=True)
class Shape:
    """One candidate of a launch that several offers satisfy: an instance type in a zone and market
    of the spec's cloud and region, at its per-node price. A launch of several shapes takes the
    first it can get, in the order given (the quote's ranking)."""

    instance: InstanceType
    zone: str
    market: Market
    hourly_micros: int = 0

    def matches(self, i: "Instance") -> bool:
        """Is ``i`` of this shape (type, market, and zone when the shape names one)?"""
        return (i.instance_type in (self.instance.name, self.instance.sdk_machine_type) and i.market is self.market
                and (not self.zone or i.zone == self.zone))


@dataclass(frozen=True, slots=True)
class BlockOrder:
    """A Capacity Block to buy for one lease: the offering quoted (``offering_id``, sold for one
    node), its zone, start and length, the nodes the lease needs, and the most the whole block
    may cost (the quoted up-front fee x nodes: a dearer one is not bought)."""

    offering_id: str
    region: str
    zone: str
    instance_type: str
    count: int
    starts_at: float  # epoch seconds
    duration_h: float
    max_fee_micros: int


class BlockState(str, enum.Enum):
    """A bought Capacity Block's reservation state, as EC2 names it."""

    PAYMENT_PENDING = "payment-pending"  # the up-front payment is being processed
    SCHEDULED = "scheduled"  # paid; its start date is ahead
    ACTIVE = "active"  # instances may be launched into it
    EXPIRED = "expired"
    PAYMENT_FAILED = "payment-failed"
    CANCELLED = "cancelled"
    FAILED = "failed"
    OTHER = "other"  # a state this broker does not know: waited on like a scheduled one

    def __str__(self) -> str:
        return self.value

    @property
    def over(self) -> bool:
        """The block can no longer be launched into."""
        return self in (BlockState.EXPIRED, BlockState.PAYMENT_FAILED, BlockState.CANCELLED, BlockState.FAILED)


@dataclass(frozen=True, slots=True)
class BoughtBlock:
    """A Capacity Block bought for a lease: its capacity reservation, where and when it runs."""

    reservation_id: str
    zone: str
    state: BlockState
    starts_at: float  # epoch seconds
    ends_at: float
    fee_micros: int = 0  # what was paid up front (0 when the cloud's answer does not say)


@runtime_checkable
class BlockBuyer(Protocol):
    """A provider that sells queued capacity paid up front (AWS Capacity Blocks for ML).

    ``buy_capacity_block`` is idempotent on ``lease_id`` (the block is tagged with it: a repeat
    returns the block bought before); the purchase is final — a block is not refundable."""

    def buy_capacity_block(self, order: BlockOrder, lease_id: str) -> BoughtBlock: ...

    def capacity_block(self, region: str, reservation_id: str) -> BoughtBlock: ...


class InstanceState(str, enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    STOPPING = "stopping"
    TERMINATED = "terminated"

    def __str__(self) -> str:
        return self.value


class StopReason(str, enum.Enum):
    """Why an instance stopped, as far as the cloud says."""

    NONE = ""  # still alive
    USER = "user"  # we (or someone) terminated it
    INTERRUPTED = "interrupted"  # spot interruption / preemption / eviction
    CAPACITY = "capacity"
    ERROR = "error"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class Instance:
    """One cloud machine as the provider reports it."""

    provider: str
    instance_id: str
    region: str
    zone: str
    instance_type: str
    market: Market
    state: InstanceState
    lease_id: str  # from the broker's tag/label ("" when untagged)
    node_name: str = ""
    private_ip: str = ""
    stop_reason: StopReason = StopReason.NONE
    stop_detail: str = ""  # the cloud's own code/message for the stop
    launched_at: float = 0.0  # epoch seconds
    # Why part of the cloud's record of it could not be read ("" when all of it could): e.g. a
    # tag written outside the broker with characters the answer cannot carry. The instance is
    # still listed (the reconciler reports it and goes on with the others).
    problem: str = ""


# ---------------------------------------------------------------------------------------------
# Errors. Every SDK error is mapped onto exactly one of these; the scope decides failover.


class Scope(str, enum.Enum):
    ZONE = "zone"
    REGION = "region"
    CLOUD = "cloud"
    OFFER = "offer"  # this instance type in this zone/region only

    def __str__(self) -> str:
        return self.value


#: Told each provider error as it is made (the broker counts them by provider and code).
ON_ERROR: list[Callable[["ProviderError"], None]] = []


class ProviderError(Exception):
    """A cloud refused or failed a call. ``code`` and ``message`` are the provider's own."""

    retryable = False
    default_scope = Scope.CLOUD

    def __init__(
        self,
        message: str,
        *,
        provider: str,
        code: str = "",
        scope: Scope | None = None,
        region: str = "",
        zone: str = "",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.provider = provider
        self.code = code
        self.scope = scope or self.default_scope
        self.region = region
        self.zone = zone
        for hook in ON_ERROR:
            try:
                hook(self)
            except Exception:  # noqa: BLE001 - counting must never change an error
                pass

    @property
    def scope_key(self) -> str:
        """What this error blocks: ``gcp``, ``aws/us-east-1`` or ``azure/eastus/1``."""
        if self.scope is Scope.CLOUD or not self.region:
            return self.provider
        if self.scope in (Scope.ZONE, Scope.OFFER) and self.zone:
            return f"{self.provider}/{self.region}/{self.zone}"
        return f"{self.provider}/{self.region}"

    def __str__(self) -> str:
        where = self.scope_key
        return f"{self.provider} {self.code or type(self).__name__} ({self.scope} {where}): {self.message}"


def offering_key(provider: str, region: str, instance_type: str, market: str) -> str:
    """The block key of one offering: ``aws/us-east-1/p5.48xlarge/spot``."""
    return f"{provider}/{region}/{instance_type}/{market}"


def scope_keys(provider: str, region: str, instance_type: str, market: str, zone: str = "") -> tuple[str, ...]:
    """Every block key that rules this offering out, widest first: the cloud, the region, the
    zone (when one is named), the offering itself — the keys :attr:`ProviderError.scope_key`
    and :func:`offering_key` write."""
    region_key = f"{provider}/{region}"
    zone_key = (f"{region_key}/{zone}",) if zone else ()
    return (provider, region_key, *zone_key, offering_key(provider, region, instance_type, market))


class CapacityError(ProviderError):
    """No capacity for this shape here now (zone or region scoped)."""

    default_scope = Scope.ZONE


class PartialFulfilment(CapacityError):
    """A several-shape launch got fewer nodes than the gang needs (``got`` of ``wanted``): what it
    got has been terminated. Scoped to the zone it got them in."""

    def __init__(self, message: str, *, got: int, wanted: int, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.got = got
        self.wanted = wanted


class NoShapeAvailable(CapacityError):
    """No shape of a several-shape launch could be had: ``failures`` holds each shape the cloud
    refused with the cloud's own error for it, in the order tried (its first error is this one's
    code). Shapes the cloud never got to are not in it."""

    def __init__(self, message: str, *, failures: Sequence[tuple[Shape, ProviderError]], **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.failures = tuple(failures)


class QuotaError(ProviderError):
    """The account's quota/limit forbids it (region scoped)."""

    default_scope = Scope.REGION


class ThrottledError(ProviderError):
    """Rate limited: retry the same call with backoff."""

    retryable = True
    default_scope = Scope.REGION


class AuthError(ProviderError):
    """Credentials missing or not allowed (whole cloud)."""

    default_scope = Scope.CLOUD


class InvalidRequestError(ProviderError):
    """The request itself is wrong (unknown type, bad parameter): retrying will not help."""

    default_scope = Scope.OFFER


class TransientError(ProviderError):
    """5xx, timeouts, connection resets: retry the same call with backoff."""

    retryable = True
    default_scope = Scope.REGION


@runtime_checkable
class Provider(Protocol):
    """What every cloud implements. All calls are synchronous and safe to retry.

    ``launch`` is all-or-nothing and idempotent on ``spec.client_token``: a retry after a crash
    returns the instances the first call created instead of creating more; if fewer than
    ``spec.count`` could be created, it terminates what it made and raises.
    """

    name: str

    def launch(self, spec: LaunchSpec) -> list[Instance]: ...

    def describe(self, lease_id: str, region: str) -> list[Instance]: ...

    def list_managed(self, regions: Sequence[str] | None = None) -> list[Instance]: ...

    def terminate(self, instances: Sequence[Instance]) -> None: ...


@runtime_checkable
class ShapesProvider(Protocol):
    """A provider that launches one lease on the first of several shapes in one request (EC2 Fleet
    ``instant``, Compute ``bulkInsert``), all or nothing like :meth:`Provider.launch`.

    ``spec`` names the lease, count, node names and boot script; its instance, zone and market are
    the first shape's. Returns the shape it got and the nodes, all of that shape. Raises
    :class:`NoShapeAvailable` when the cloud refused every shape, :class:`PartialFulfilment` when
    it gave fewer than ``spec.count`` nodes (terminated before raising), or any provider error the
    request itself met. One shape behaves exactly as :meth:`Provider.launch`."""

    def launch_shapes(self, spec: LaunchSpec, shapes: Sequence[Shape]) -> tuple[Shape, list[Instance]]: ...


# Tag / label keys on every resource the broker creates (GCP labels allow only [a-z0-9_-]).
TAG_LEASE = "broker:lease"
TAG_OWNER = "broker:owner"
LABEL_LEASE = "broker-lease"
LABEL_OWNER = "broker-owner"
