import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Market(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MARKET_UNSPECIFIED: _ClassVar[Market]
    MARKET_ON_DEMAND: _ClassVar[Market]
    MARKET_SPOT: _ClassVar[Market]
    MARKET_RESERVED: _ClassVar[Market]
    MARKET_QUEUED: _ClassVar[Market]

class ExclusionKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EXCLUSION_KIND_UNSPECIFIED: _ClassVar[ExclusionKind]
    EXCLUSION_KIND_SHAPE: _ClassVar[ExclusionKind]
    EXCLUSION_KIND_PROVIDER: _ClassVar[ExclusionKind]
    EXCLUSION_KIND_REGION: _ClassVar[ExclusionKind]
    EXCLUSION_KIND_RESIDENCY: _ClassVar[ExclusionKind]
    EXCLUSION_KIND_MARKET: _ClassVar[ExclusionKind]
    EXCLUSION_KIND_RESERVATION: _ClassVar[ExclusionKind]
    EXCLUSION_KIND_SLA: _ClassVar[ExclusionKind]
    EXCLUSION_KIND_DEADLINE: _ClassVar[ExclusionKind]
    EXCLUSION_KIND_BLOCKED: _ClassVar[ExclusionKind]
    EXCLUSION_KIND_QUOTA: _ClassVar[ExclusionKind]
    EXCLUSION_KIND_NOT_LAUNCHABLE: _ClassVar[ExclusionKind]

class JobState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_STATE_UNSPECIFIED: _ClassVar[JobState]
    JOB_STATE_RUNNING: _ClassVar[JobState]
    JOB_STATE_SUCCEEDED: _ClassVar[JobState]
    JOB_STATE_FAILED: _ClassVar[JobState]
    JOB_STATE_CANCELLED: _ClassVar[JobState]

class JobAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_ACTION_UNSPECIFIED: _ClassVar[JobAction]
    JOB_ACTION_CONTINUE: _ClassVar[JobAction]
    JOB_ACTION_CHECKPOINT: _ClassVar[JobAction]
    JOB_ACTION_STOP: _ClassVar[JobAction]

class LeaseState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LEASE_STATE_UNSPECIFIED: _ClassVar[LeaseState]
    LEASE_STATE_REQUESTED: _ClassVar[LeaseState]
    LEASE_STATE_PROVISIONING: _ClassVar[LeaseState]
    LEASE_STATE_RUNNING: _ClassVar[LeaseState]
    LEASE_STATE_DRAINING: _ClassVar[LeaseState]
    LEASE_STATE_RELEASED: _ClassVar[LeaseState]
    LEASE_STATE_FAILED: _ClassVar[LeaseState]

class LeaseEventKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LEASE_EVENT_KIND_UNSPECIFIED: _ClassVar[LeaseEventKind]
    LEASE_EVENT_KIND_STATE_CHANGED: _ClassVar[LeaseEventKind]
    LEASE_EVENT_KIND_INTERRUPTED: _ClassVar[LeaseEventKind]
    LEASE_EVENT_KIND_REQUEUE: _ClassVar[LeaseEventKind]
    LEASE_EVENT_KIND_BUDGET: _ClassVar[LeaseEventKind]
    LEASE_EVENT_KIND_DECISION: _ClassVar[LeaseEventKind]
    LEASE_EVENT_KIND_HANDOFF: _ClassVar[LeaseEventKind]
    LEASE_EVENT_KIND_JOB: _ClassVar[LeaseEventKind]
    LEASE_EVENT_KIND_LIFETIME_WARNING: _ClassVar[LeaseEventKind]
    LEASE_EVENT_KIND_LIFETIME_EXTENDED: _ClassVar[LeaseEventKind]
    LEASE_EVENT_KIND_BUDGET_WARNING: _ClassVar[LeaseEventKind]
    LEASE_EVENT_KIND_INTERRUPTION_NOTICE: _ClassVar[LeaseEventKind]
    LEASE_EVENT_KIND_CAPACITY_BLOCK: _ClassVar[LeaseEventKind]

class Verdict(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    VERDICT_UNSPECIFIED: _ClassVar[Verdict]
    VERDICT_HEALTHY: _ClassVar[Verdict]
    VERDICT_RESOURCE_BOUND: _ClassVar[Verdict]
    VERDICT_SCHEDULING_BOUND: _ClassVar[Verdict]
    VERDICT_MIXED: _ClassVar[Verdict]
MARKET_UNSPECIFIED: Market
MARKET_ON_DEMAND: Market
MARKET_SPOT: Market
MARKET_RESERVED: Market
MARKET_QUEUED: Market
EXCLUSION_KIND_UNSPECIFIED: ExclusionKind
EXCLUSION_KIND_SHAPE: ExclusionKind
EXCLUSION_KIND_PROVIDER: ExclusionKind
EXCLUSION_KIND_REGION: ExclusionKind
EXCLUSION_KIND_RESIDENCY: ExclusionKind
EXCLUSION_KIND_MARKET: ExclusionKind
EXCLUSION_KIND_RESERVATION: ExclusionKind
EXCLUSION_KIND_SLA: ExclusionKind
EXCLUSION_KIND_DEADLINE: ExclusionKind
EXCLUSION_KIND_BLOCKED: ExclusionKind
EXCLUSION_KIND_QUOTA: ExclusionKind
EXCLUSION_KIND_NOT_LAUNCHABLE: ExclusionKind
JOB_STATE_UNSPECIFIED: JobState
JOB_STATE_RUNNING: JobState
JOB_STATE_SUCCEEDED: JobState
JOB_STATE_FAILED: JobState
JOB_STATE_CANCELLED: JobState
JOB_ACTION_UNSPECIFIED: JobAction
JOB_ACTION_CONTINUE: JobAction
JOB_ACTION_CHECKPOINT: JobAction
JOB_ACTION_STOP: JobAction
LEASE_STATE_UNSPECIFIED: LeaseState
LEASE_STATE_REQUESTED: LeaseState
LEASE_STATE_PROVISIONING: LeaseState
LEASE_STATE_RUNNING: LeaseState
LEASE_STATE_DRAINING: LeaseState
LEASE_STATE_RELEASED: LeaseState
LEASE_STATE_FAILED: LeaseState
LEASE_EVENT_KIND_UNSPECIFIED: LeaseEventKind
LEASE_EVENT_KIND_STATE_CHANGED: LeaseEventKind
LEASE_EVENT_KIND_INTERRUPTED: LeaseEventKind
LEASE_EVENT_KIND_REQUEUE: LeaseEventKind
LEASE_EVENT_KIND_BUDGET: LeaseEventKind
LEASE_EVENT_KIND_DECISION: LeaseEventKind
LEASE_EVENT_KIND_HANDOFF: LeaseEventKind
LEASE_EVENT_KIND_JOB: LeaseEventKind
LEASE_EVENT_KIND_LIFETIME_WARNING: LeaseEventKind
LEASE_EVENT_KIND_LIFETIME_EXTENDED: LeaseEventKind
LEASE_EVENT_KIND_BUDGET_WARNING: LeaseEventKind
LEASE_EVENT_KIND_INTERRUPTION_NOTICE: LeaseEventKind
LEASE_EVENT_KIND_CAPACITY_BLOCK: LeaseEventKind
VERDICT_UNSPECIFIED: Verdict
VERDICT_HEALTHY: Verdict
VERDICT_RESOURCE_BOUND: Verdict
VERDICT_SCHEDULING_BOUND: Verdict
VERDICT_MIXED: Verdict

class Demand(_message.Message):
    __slots__ = ("gpu_model", "min_gpu_memory_gb", "gpus", "nodes", "hours", "data_in_gb", "data_location", "data_out_gb", "interruptible", "checkpoint_minutes", "providers", "regions", "residency", "min_sla_pct", "deadline", "tenant")
    GPU_MODEL_FIELD_NUMBER: _ClassVar[int]
    MIN_GPU_MEMORY_GB_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    HOURS_FIELD_NUMBER: _ClassVar[int]
    DATA_IN_GB_FIELD_NUMBER: _ClassVar[int]
    DATA_LOCATION_FIELD_NUMBER: _ClassVar[int]
    DATA_OUT_GB_FIELD_NUMBER: _ClassVar[int]
    INTERRUPTIBLE_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_MINUTES_FIELD_NUMBER: _ClassVar[int]
    PROVIDERS_FIELD_NUMBER: _ClassVar[int]
    REGIONS_FIELD_NUMBER: _ClassVar[int]
    RESIDENCY_FIELD_NUMBER: _ClassVar[int]
    MIN_SLA_PCT_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    gpu_model: str
    min_gpu_memory_gb: int
    gpus: int
    nodes: int
    hours: float
    data_in_gb: float
    data_location: str
    data_out_gb: float
    interruptible: bool
    checkpoint_minutes: int
    providers: _containers.RepeatedScalarFieldContainer[str]
    regions: _containers.RepeatedScalarFieldContainer[str]
    residency: _containers.RepeatedScalarFieldContainer[str]
    min_sla_pct: float
    deadline: _timestamp_pb2.Timestamp
    tenant: str
    def __init__(self, gpu_model: _Optional[str] = ..., min_gpu_memory_gb: _Optional[int] = ..., gpus: _Optional[int] = ..., nodes: _Optional[int] = ..., hours: _Optional[float] = ..., data_in_gb: _Optional[float] = ..., data_location: _Optional[str] = ..., data_out_gb: _Optional[float] = ..., interruptible: _Optional[bool] = ..., checkpoint_minutes: _Optional[int] = ..., providers: _Optional[_Iterable[str]] = ..., regions: _Optional[_Iterable[str]] = ..., residency: _Optional[_Iterable[str]] = ..., min_sla_pct: _Optional[float] = ..., deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., tenant: _Optional[str] = ...) -> None: ...

class CostBreakdown(_message.Message):
    __slots__ = ("compute_usd", "interruption_usd", "storage_usd", "data_transfer_usd", "sla_risk_usd", "total_usd")
    COMPUTE_USD_FIELD_NUMBER: _ClassVar[int]
    INTERRUPTION_USD_FIELD_NUMBER: _ClassVar[int]
    STORAGE_USD_FIELD_NUMBER: _ClassVar[int]
    DATA_TRANSFER_USD_FIELD_NUMBER: _ClassVar[int]
    SLA_RISK_USD_FIELD_NUMBER: _ClassVar[int]
    TOTAL_USD_FIELD_NUMBER: _ClassVar[int]
    compute_usd: str
    interruption_usd: str
    storage_usd: str
    data_transfer_usd: str
    sla_risk_usd: str
    total_usd: str
    def __init__(self, compute_usd: _Optional[str] = ..., interruption_usd: _Optional[str] = ..., storage_usd: _Optional[str] = ..., data_transfer_usd: _Optional[str] = ..., sla_risk_usd: _Optional[str] = ..., total_usd: _Optional[str] = ...) -> None: ...

class Offer(_message.Message):
    __slots__ = ("rank", "provider", "region", "zone", "instance_type", "gpu", "gpus_per_node", "gpu_memory_gb", "nodes", "market", "hourly_usd", "interconnect", "interconnect_gbps", "sla_pct", "runtime_hours", "cost", "price_as_of", "price_source", "stale", "zones", "interruptions_per_hour", "interruption_source", "starts_at", "upfront_usd", "max_run_hours")
    RANK_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    GPUS_PER_NODE_FIELD_NUMBER: _ClassVar[int]
    GPU_MEMORY_GB_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    MARKET_FIELD_NUMBER: _ClassVar[int]
    HOURLY_USD_FIELD_NUMBER: _ClassVar[int]
    INTERCONNECT_FIELD_NUMBER: _ClassVar[int]
    INTERCONNECT_GBPS_FIELD_NUMBER: _ClassVar[int]
    SLA_PCT_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_HOURS_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    PRICE_AS_OF_FIELD_NUMBER: _ClassVar[int]
    PRICE_SOURCE_FIELD_NUMBER: _ClassVar[int]
    STALE_FIELD_NUMBER: _ClassVar[int]
    ZONES_FIELD_NUMBER: _ClassVar[int]
    INTERRUPTIONS_PER_HOUR_FIELD_NUMBER: _ClassVar[int]
    INTERRUPTION_SOURCE_FIELD_NUMBER: _ClassVar[int]
    STARTS_AT_FIELD_NUMBER: _ClassVar[int]
    UPFRONT_USD_FIELD_NUMBER: _ClassVar[int]
    MAX_RUN_HOURS_FIELD_NUMBER: _ClassVar[int]
    rank: int
    provider: str
    region: str
    zone: str
    instance_type: str
    gpu: str
    gpus_per_node: int
    gpu_memory_gb: int
    nodes: int
    market: Market
    hourly_usd: str
    interconnect: str
    interconnect_gbps: int
    sla_pct: float
    runtime_hours: float
    cost: CostBreakdown
    price_as_of: str
    price_source: str
    stale: bool
    zones: _containers.RepeatedScalarFieldContainer[str]
    interruptions_per_hour: float
    interruption_source: str
    starts_at: str
    upfront_usd: float
    max_run_hours: float
    def __init__(self, rank: _Optional[int] = ..., provider: _Optional[str] = ..., region: _Optional[str] = ..., zone: _Optional[str] = ..., instance_type: _Optional[str] = ..., gpu: _Optional[str] = ..., gpus_per_node: _Optional[int] = ..., gpu_memory_gb: _Optional[int] = ..., nodes: _Optional[int] = ..., market: _Optional[_Union[Market, str]] = ..., hourly_usd: _Optional[str] = ..., interconnect: _Optional[str] = ..., interconnect_gbps: _Optional[int] = ..., sla_pct: _Optional[float] = ..., runtime_hours: _Optional[float] = ..., cost: _Optional[_Union[CostBreakdown, _Mapping]] = ..., price_as_of: _Optional[str] = ..., price_source: _Optional[str] = ..., stale: _Optional[bool] = ..., zones: _Optional[_Iterable[str]] = ..., interruptions_per_hour: _Optional[float] = ..., interruption_source: _Optional[str] = ..., starts_at: _Optional[str] = ..., upfront_usd: _Optional[float] = ..., max_run_hours: _Optional[float] = ...) -> None: ...

class ExcludedOffer(_message.Message):
    __slots__ = ("provider", "region", "instance_type", "market", "reason", "kind", "starts_at", "upfront_usd", "max_run_hours")
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    MARKET_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    STARTS_AT_FIELD_NUMBER: _ClassVar[int]
    UPFRONT_USD_FIELD_NUMBER: _ClassVar[int]
    MAX_RUN_HOURS_FIELD_NUMBER: _ClassVar[int]
    provider: str
    region: str
    instance_type: str
    market: Market
    reason: str
    kind: ExclusionKind
    starts_at: str
    upfront_usd: float
    max_run_hours: float
    def __init__(self, provider: _Optional[str] = ..., region: _Optional[str] = ..., instance_type: _Optional[str] = ..., market: _Optional[_Union[Market, str]] = ..., reason: _Optional[str] = ..., kind: _Optional[_Union[ExclusionKind, str]] = ..., starts_at: _Optional[str] = ..., upfront_usd: _Optional[float] = ..., max_run_hours: _Optional[float] = ...) -> None: ...

class Quote(_message.Message):
    __slots__ = ("quote_id", "valid_until", "catalog_as_of", "demand", "offers", "excluded", "spot_model", "prices_only")
    QUOTE_ID_FIELD_NUMBER: _ClassVar[int]
    VALID_UNTIL_FIELD_NUMBER: _ClassVar[int]
    CATALOG_AS_OF_FIELD_NUMBER: _ClassVar[int]
    DEMAND_FIELD_NUMBER: _ClassVar[int]
    OFFERS_FIELD_NUMBER: _ClassVar[int]
    EXCLUDED_FIELD_NUMBER: _ClassVar[int]
    SPOT_MODEL_FIELD_NUMBER: _ClassVar[int]
    PRICES_ONLY_FIELD_NUMBER: _ClassVar[int]
    quote_id: str
    valid_until: _timestamp_pb2.Timestamp
    catalog_as_of: str
    demand: Demand
    offers: _containers.RepeatedCompositeFieldContainer[Offer]
    excluded: _containers.RepeatedCompositeFieldContainer[ExcludedOffer]
    spot_model: str
    prices_only: bool
    def __init__(self, quote_id: _Optional[str] = ..., valid_until: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., catalog_as_of: _Optional[str] = ..., demand: _Optional[_Union[Demand, _Mapping]] = ..., offers: _Optional[_Iterable[_Union[Offer, _Mapping]]] = ..., excluded: _Optional[_Iterable[_Union[ExcludedOffer, _Mapping]]] = ..., spot_model: _Optional[str] = ..., prices_only: _Optional[bool] = ...) -> None: ...

class QuoteRequest(_message.Message):
    __slots__ = ("demand", "top")
    DEMAND_FIELD_NUMBER: _ClassVar[int]
    TOP_FIELD_NUMBER: _ClassVar[int]
    demand: Demand
    top: int
    def __init__(self, demand: _Optional[_Union[Demand, _Mapping]] = ..., top: _Optional[int] = ...) -> None: ...

class QuoteResponse(_message.Message):
    __slots__ = ("quote",)
    QUOTE_FIELD_NUMBER: _ClassVar[int]
    quote: Quote
    def __init__(self, quote: _Optional[_Union[Quote, _Mapping]] = ...) -> None: ...

class QuoteOffer(_message.Message):
    __slots__ = ("quote_id", "rank")
    QUOTE_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    quote_id: str
    rank: int
    def __init__(self, quote_id: _Optional[str] = ..., rank: _Optional[int] = ...) -> None: ...

class Offering(_message.Message):
    __slots__ = ("provider", "region", "zone", "instance_type", "market", "count")
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    MARKET_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    provider: str
    region: str
    zone: str
    instance_type: str
    market: Market
    count: int
    def __init__(self, provider: _Optional[str] = ..., region: _Optional[str] = ..., zone: _Optional[str] = ..., instance_type: _Optional[str] = ..., market: _Optional[_Union[Market, str]] = ..., count: _Optional[int] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ("job_id", "owner", "queue", "checkpoint_uri", "dataset_uri", "env", "state", "restarts", "max_restarts")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_URI_FIELD_NUMBER: _ClassVar[int]
    DATASET_URI_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    MAX_RESTARTS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    owner: str
    queue: str
    checkpoint_uri: str
    dataset_uri: str
    env: _containers.ScalarMap[str, str]
    state: JobState
    restarts: int
    max_restarts: int
    def __init__(self, job_id: _Optional[str] = ..., owner: _Optional[str] = ..., queue: _Optional[str] = ..., checkpoint_uri: _Optional[str] = ..., dataset_uri: _Optional[str] = ..., env: _Optional[_Mapping[str, str]] = ..., state: _Optional[_Union[JobState, str]] = ..., restarts: _Optional[int] = ..., max_restarts: _Optional[int] = ...) -> None: ...

class ReportJobRequest(_message.Message):
    __slots__ = ("lease_id", "job_id", "state", "exit_code", "checkpoint_uri", "progress")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_URI_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    job_id: str
    state: JobState
    exit_code: int
    checkpoint_uri: str
    progress: float
    def __init__(self, lease_id: _Optional[str] = ..., job_id: _Optional[str] = ..., state: _Optional[_Union[JobState, str]] = ..., exit_code: _Optional[int] = ..., checkpoint_uri: _Optional[str] = ..., progress: _Optional[float] = ...) -> None: ...

class ReportJobResponse(_message.Message):
    __slots__ = ("lease", "action")
    LEASE_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    lease: Lease
    action: JobAction
    def __init__(self, lease: _Optional[_Union[Lease, _Mapping]] = ..., action: _Optional[_Union[JobAction, str]] = ...) -> None: ...

class LaunchRequest(_message.Message):
    __slots__ = ("idempotency_key", "quote_offer", "offering", "tenant", "bootstrap", "job", "max_lifetime_s", "node_names", "max_restarts")
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    QUOTE_OFFER_FIELD_NUMBER: _ClassVar[int]
    OFFERING_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    BOOTSTRAP_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    MAX_LIFETIME_S_FIELD_NUMBER: _ClassVar[int]
    NODE_NAMES_FIELD_NUMBER: _ClassVar[int]
    MAX_RESTARTS_FIELD_NUMBER: _ClassVar[int]
    idempotency_key: str
    quote_offer: QuoteOffer
    offering: Offering
    tenant: str
    bootstrap: str
    job: Job
    max_lifetime_s: int
    node_names: _containers.RepeatedScalarFieldContainer[str]
    max_restarts: int
    def __init__(self, idempotency_key: _Optional[str] = ..., quote_offer: _Optional[_Union[QuoteOffer, _Mapping]] = ..., offering: _Optional[_Union[Offering, _Mapping]] = ..., tenant: _Optional[str] = ..., bootstrap: _Optional[str] = ..., job: _Optional[_Union[Job, _Mapping]] = ..., max_lifetime_s: _Optional[int] = ..., node_names: _Optional[_Iterable[str]] = ..., max_restarts: _Optional[int] = ...) -> None: ...

class LaunchResponse(_message.Message):
    __slots__ = ("lease",)
    LEASE_FIELD_NUMBER: _ClassVar[int]
    lease: Lease
    def __init__(self, lease: _Optional[_Union[Lease, _Mapping]] = ...) -> None: ...

class Instance(_message.Message):
    __slots__ = ("instance_id", "node_name", "zone", "private_ip", "state")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_NAME_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    PRIVATE_IP_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    node_name: str
    zone: str
    private_ip: str
    state: str
    def __init__(self, instance_id: _Optional[str] = ..., node_name: _Optional[str] = ..., zone: _Optional[str] = ..., private_ip: _Optional[str] = ..., state: _Optional[str] = ...) -> None: ...

class Lease(_message.Message):
    __slots__ = ("lease_id", "state", "state_reason", "provider", "region", "zone", "instance_type", "market", "nodes", "hourly_usd", "cost_so_far_usd", "instances", "idempotency_key", "tenant", "quote_id", "job", "created_at", "updated_at")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    STATE_REASON_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    MARKET_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    HOURLY_USD_FIELD_NUMBER: _ClassVar[int]
    COST_SO_FAR_USD_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    QUOTE_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    state: LeaseState
    state_reason: str
    provider: str
    region: str
    zone: str
    instance_type: str
    market: Market
    nodes: int
    hourly_usd: str
    cost_so_far_usd: str
    instances: _containers.RepeatedCompositeFieldContainer[Instance]
    idempotency_key: str
    tenant: str
    quote_id: str
    job: Job
    created_at: _timestamp_pb2.Timestamp
    updated_at: _timestamp_pb2.Timestamp
    def __init__(self, lease_id: _Optional[str] = ..., state: _Optional[_Union[LeaseState, str]] = ..., state_reason: _Optional[str] = ..., provider: _Optional[str] = ..., region: _Optional[str] = ..., zone: _Optional[str] = ..., instance_type: _Optional[str] = ..., market: _Optional[_Union[Market, str]] = ..., nodes: _Optional[int] = ..., hourly_usd: _Optional[str] = ..., cost_so_far_usd: _Optional[str] = ..., instances: _Optional[_Iterable[_Union[Instance, _Mapping]]] = ..., idempotency_key: _Optional[str] = ..., tenant: _Optional[str] = ..., quote_id: _Optional[str] = ..., job: _Optional[_Union[Job, _Mapping]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class GetLeaseRequest(_message.Message):
    __slots__ = ("lease_id",)
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    def __init__(self, lease_id: _Optional[str] = ...) -> None: ...

class GetLeaseResponse(_message.Message):
    __slots__ = ("lease",)
    LEASE_FIELD_NUMBER: _ClassVar[int]
    lease: Lease
    def __init__(self, lease: _Optional[_Union[Lease, _Mapping]] = ...) -> None: ...

class ListLeasesRequest(_message.Message):
    __slots__ = ("states", "tenant", "limit", "page_token")
    STATES_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    states: _containers.RepeatedScalarFieldContainer[LeaseState]
    tenant: str
    limit: int
    page_token: str
    def __init__(self, states: _Optional[_Iterable[_Union[LeaseState, str]]] = ..., tenant: _Optional[str] = ..., limit: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListLeasesResponse(_message.Message):
    __slots__ = ("leases", "next_page_token")
    LEASES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    leases: _containers.RepeatedCompositeFieldContainer[Lease]
    next_page_token: str
    def __init__(self, leases: _Optional[_Iterable[_Union[Lease, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class WatchLeasesRequest(_message.Message):
    __slots__ = ("lease_id", "after_event_id")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    after_event_id: int
    def __init__(self, lease_id: _Optional[str] = ..., after_event_id: _Optional[int] = ...) -> None: ...

class Decision(_message.Message):
    __slots__ = ("decision_id", "at", "action", "reason", "job_ids", "lease_id")
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    JOB_IDS_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    decision_id: str
    at: _timestamp_pb2.Timestamp
    action: str
    reason: str
    job_ids: _containers.RepeatedScalarFieldContainer[str]
    lease_id: str
    def __init__(self, decision_id: _Optional[str] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., action: _Optional[str] = ..., reason: _Optional[str] = ..., job_ids: _Optional[_Iterable[str]] = ..., lease_id: _Optional[str] = ...) -> None: ...

class ListDecisionsRequest(_message.Message):
    __slots__ = ("limit", "since")
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    limit: int
    since: _timestamp_pb2.Timestamp
    def __init__(self, limit: _Optional[int] = ..., since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListDecisionsResponse(_message.Message):
    __slots__ = ("decisions",)
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    decisions: _containers.RepeatedCompositeFieldContainer[Decision]
    def __init__(self, decisions: _Optional[_Iterable[_Union[Decision, _Mapping]]] = ...) -> None: ...

class WatchLeasesResponse(_message.Message):
    __slots__ = ("kind", "at", "lease", "message", "job", "decision", "event_id")
    KIND_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    kind: LeaseEventKind
    at: _timestamp_pb2.Timestamp
    lease: Lease
    message: str
    job: Job
    decision: Decision
    event_id: int
    def __init__(self, kind: _Optional[_Union[LeaseEventKind, str]] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., lease: _Optional[_Union[Lease, _Mapping]] = ..., message: _Optional[str] = ..., job: _Optional[_Union[Job, _Mapping]] = ..., decision: _Optional[_Union[Decision, _Mapping]] = ..., event_id: _Optional[int] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("lease_id", "reason")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    reason: str
    def __init__(self, lease_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("lease",)
    LEASE_FIELD_NUMBER: _ClassVar[int]
    lease: Lease
    def __init__(self, lease: _Optional[_Union[Lease, _Mapping]] = ...) -> None: ...

class HandoffRequest(_message.Message):
    __slots__ = ("lease_id", "job")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    job: Job
    def __init__(self, lease_id: _Optional[str] = ..., job: _Optional[_Union[Job, _Mapping]] = ...) -> None: ...

class HandoffResponse(_message.Message):
    __slots__ = ("lease",)
    LEASE_FIELD_NUMBER: _ClassVar[int]
    lease: Lease
    def __init__(self, lease: _Optional[_Union[Lease, _Mapping]] = ...) -> None: ...

class PendingJob(_message.Message):
    __slots__ = ("job_id", "user", "queue", "gpus", "gpu_model", "min_gpu_memory_gb", "nodes", "time_limit_s", "est_runtime_s", "waited_s", "pending_reason", "interruptible", "checkpoint_minutes", "data_gb", "kind", "exclusive", "job_class", "priority", "qos")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    GPU_MODEL_FIELD_NUMBER: _ClassVar[int]
    MIN_GPU_MEMORY_GB_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    TIME_LIMIT_S_FIELD_NUMBER: _ClassVar[int]
    EST_RUNTIME_S_FIELD_NUMBER: _ClassVar[int]
    WAITED_S_FIELD_NUMBER: _ClassVar[int]
    PENDING_REASON_FIELD_NUMBER: _ClassVar[int]
    INTERRUPTIBLE_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_MINUTES_FIELD_NUMBER: _ClassVar[int]
    DATA_GB_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    EXCLUSIVE_FIELD_NUMBER: _ClassVar[int]
    JOB_CLASS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    QOS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    user: str
    queue: str
    gpus: int
    gpu_model: str
    min_gpu_memory_gb: int
    nodes: int
    time_limit_s: int
    est_runtime_s: int
    waited_s: int
    pending_reason: str
    interruptible: bool
    checkpoint_minutes: int
    data_gb: float
    kind: str
    exclusive: bool
    job_class: str
    priority: int
    qos: str
    def __init__(self, job_id: _Optional[str] = ..., user: _Optional[str] = ..., queue: _Optional[str] = ..., gpus: _Optional[int] = ..., gpu_model: _Optional[str] = ..., min_gpu_memory_gb: _Optional[int] = ..., nodes: _Optional[int] = ..., time_limit_s: _Optional[int] = ..., est_runtime_s: _Optional[int] = ..., waited_s: _Optional[int] = ..., pending_reason: _Optional[str] = ..., interruptible: _Optional[bool] = ..., checkpoint_minutes: _Optional[int] = ..., data_gb: _Optional[float] = ..., kind: _Optional[str] = ..., exclusive: _Optional[bool] = ..., job_class: _Optional[str] = ..., priority: _Optional[int] = ..., qos: _Optional[str] = ...) -> None: ...

class ClusterNode(_message.Message):
    __slots__ = ("name", "state", "gpus_total", "gpus_allocated", "gpu_model", "partitions", "reason")
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    GPUS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    GPUS_ALLOCATED_FIELD_NUMBER: _ClassVar[int]
    GPU_MODEL_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    name: str
    state: str
    gpus_total: int
    gpus_allocated: int
    gpu_model: str
    partitions: _containers.RepeatedScalarFieldContainer[str]
    reason: str
    def __init__(self, name: _Optional[str] = ..., state: _Optional[str] = ..., gpus_total: _Optional[int] = ..., gpus_allocated: _Optional[int] = ..., gpu_model: _Optional[str] = ..., partitions: _Optional[_Iterable[str]] = ..., reason: _Optional[str] = ...) -> None: ...

class GpuSample(_message.Message):
    __slots__ = ("node", "index", "utilization_pct", "memory_used_mb")
    NODE_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_PCT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_MB_FIELD_NUMBER: _ClassVar[int]
    node: str
    index: int
    utilization_pct: float
    memory_used_mb: float
    def __init__(self, node: _Optional[str] = ..., index: _Optional[int] = ..., utilization_pct: _Optional[float] = ..., memory_used_mb: _Optional[float] = ...) -> None: ...

class RunningJob(_message.Message):
    __slots__ = ("job_id", "user", "queue", "gpus", "nodes", "runtime_s", "time_limit_s", "est_runtime_s")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_S_FIELD_NUMBER: _ClassVar[int]
    TIME_LIMIT_S_FIELD_NUMBER: _ClassVar[int]
    EST_RUNTIME_S_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    user: str
    queue: str
    gpus: int
    nodes: _containers.RepeatedScalarFieldContainer[str]
    runtime_s: int
    time_limit_s: int
    est_runtime_s: int
    def __init__(self, job_id: _Optional[str] = ..., user: _Optional[str] = ..., queue: _Optional[str] = ..., gpus: _Optional[int] = ..., nodes: _Optional[_Iterable[str]] = ..., runtime_s: _Optional[int] = ..., time_limit_s: _Optional[int] = ..., est_runtime_s: _Optional[int] = ...) -> None: ...

class QueueSnapshot(_message.Message):
    __slots__ = ("source", "taken_at", "pending", "nodes", "gpu_samples", "running")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    TAKEN_AT_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    GPU_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    source: str
    taken_at: _timestamp_pb2.Timestamp
    pending: _containers.RepeatedCompositeFieldContainer[PendingJob]
    nodes: _containers.RepeatedCompositeFieldContainer[ClusterNode]
    gpu_samples: _containers.RepeatedCompositeFieldContainer[GpuSample]
    running: _containers.RepeatedCompositeFieldContainer[RunningJob]
    def __init__(self, source: _Optional[str] = ..., taken_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., pending: _Optional[_Iterable[_Union[PendingJob, _Mapping]]] = ..., nodes: _Optional[_Iterable[_Union[ClusterNode, _Mapping]]] = ..., gpu_samples: _Optional[_Iterable[_Union[GpuSample, _Mapping]]] = ..., running: _Optional[_Iterable[_Union[RunningJob, _Mapping]]] = ...) -> None: ...

class ReportQueueRequest(_message.Message):
    __slots__ = ("snapshot",)
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    snapshot: QueueSnapshot
    def __init__(self, snapshot: _Optional[_Union[QueueSnapshot, _Mapping]] = ...) -> None: ...

class Cause(_message.Message):
    __slots__ = ("kind", "summary", "jobs", "nodes", "action")
    KIND_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    kind: str
    summary: str
    jobs: _containers.RepeatedScalarFieldContainer[str]
    nodes: _containers.RepeatedScalarFieldContainer[str]
    action: str
    def __init__(self, kind: _Optional[str] = ..., summary: _Optional[str] = ..., jobs: _Optional[_Iterable[str]] = ..., nodes: _Optional[_Iterable[str]] = ..., action: _Optional[str] = ...) -> None: ...

class Diagnosis(_message.Message):
    __slots__ = ("verdict", "allocation_rate", "utilization", "pending_gpus", "causes", "actions")
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    ALLOCATION_RATE_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    PENDING_GPUS_FIELD_NUMBER: _ClassVar[int]
    CAUSES_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    verdict: Verdict
    allocation_rate: float
    utilization: float
    pending_gpus: int
    causes: _containers.RepeatedCompositeFieldContainer[Cause]
    actions: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, verdict: _Optional[_Union[Verdict, str]] = ..., allocation_rate: _Optional[float] = ..., utilization: _Optional[float] = ..., pending_gpus: _Optional[int] = ..., causes: _Optional[_Iterable[_Union[Cause, _Mapping]]] = ..., actions: _Optional[_Iterable[str]] = ...) -> None: ...

class ReportQueueResponse(_message.Message):
    __slots__ = ("diagnosis", "decisions")
    DIAGNOSIS_FIELD_NUMBER: _ClassVar[int]
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    diagnosis: Diagnosis
    decisions: _containers.RepeatedCompositeFieldContainer[Decision]
    def __init__(self, diagnosis: _Optional[_Union[Diagnosis, _Mapping]] = ..., decisions: _Optional[_Iterable[_Union[Decision, _Mapping]]] = ...) -> None: ...

class DiagnoseRequest(_message.Message):
    __slots__ = ("snapshot",)
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    snapshot: QueueSnapshot
    def __init__(self, snapshot: _Optional[_Union[QueueSnapshot, _Mapping]] = ...) -> None: ...

class DiagnoseResponse(_message.Message):
    __slots__ = ("diagnosis",)
    DIAGNOSIS_FIELD_NUMBER: _ClassVar[int]
    diagnosis: Diagnosis
    def __init__(self, diagnosis: _Optional[_Union[Diagnosis, _Mapping]] = ...) -> None: ...
