"""The full cost of serving a Demand with an Offering: every line, or the reason it cannot.

All money is integer micro-dollars. ``price`` is pure: the same inputs always give the same
answer, and ``now`` (epoch seconds) is a parameter, so the simulator and the service agree.

Lines (DESIGN.md, "The cost of an offer"):

- compute: hourly price x nodes x runtime, where runtime is the demand's hours stretched for a
  slower GPU (memory-matched demands) and, for multi-node jobs, for weaker interconnect.
- interruption (spot only): the wall time interruptions are expected to cost x the whole gang's
  hourly price, by :func:`policies.spot.overhead_h` (the observed lifetime distribution when the
  context has one, else expected interruptions x (half a checkpoint interval plus a restart)).
- storage: dataset and results held in the region for the run.
- data_transfer: dataset in (on-prem egress, or cloud egress / cross-region from where it lives)
  plus results out (the offer's internet egress tiers).
- sla_risk: the chance that the lease is hit, times the compute it covers. A lease of ``n``
  nodes is hit when any one of its nodes is down, which at the published availability ``a`` has
  the chance ``1 - a**n`` (:func:`lease_down_share`); so the line is at most the compute line,
  however large the gang (it nears it as the gang grows).
"""
from __future__ import annotations

import datetime as _dt
import enum
import math
from dataclasses import dataclass
from typing import Callable, NamedTuple

from providers.base import InstanceType, Market, Offering, scope_keys
from providers.catalog import Region, Terms

from policies.demand import Demand
from policies.spot import LifetimeDist, overhead_h as spot_overhead_h

HOURS_PER_MONTH = 730.0
# A multi-node job needs at least this node-to-node bandwidth at all.
MIN_MULTINODE_GBPS = 100
# Per-GPU bandwidth at which a multi-node job runs at full speed (p5 / ND H100 v5: 3200 Gbps / 8).
FULL_SPEED_GBPS_PER_GPU = 400.0
# Worst-case slowdown of a communication-bound job on the weakest accepted interconnect.
MAX_INTERCONNECT_STRETCH = 0.30
REFERENCE_GPU = "A100"  # memory-matched demands give hours on an A100
SHORT_LIVED = "spot nodes here do not live long enough to reach a checkpoint"


def utc(ts: float) -> str:
    """``ts`` (epoch seconds) as RFC 3339 UTC to the minute, for sentences."""
    return _dt.datetime.fromtimestamp(ts, _dt.timezone.utc).strftime("%Y-%m-%dT%H:%MZ")


def queued_reason(o: Offering, run_h: float, wall_h: float, d: Demand, now: float) -> Reason | None:
    """Why queued capacity cannot serve the demand: its run is longer than the capacity allows,
    or its start (``wall_h`` counts the wait) comes too late for the deadline."""
    if o.max_run_h and run_h > o.max_run_h:
        return Reason(ExclusionKind.MARKET, f"runs {run_h:.1f} h, longer than the {o.max_run_h:g} h "
                                            f"this queued capacity allows")
    if d.deadline is None:
        return None
    start = o.start_after(now)
    if start >= d.deadline:
        return Reason(ExclusionKind.DEADLINE, f"starts at {utc(start)}, after the deadline {utc(d.deadline)}")
    if now + wall_h * 3600.0 > d.deadline:
        return Reason(ExclusionKind.DEADLINE, f"starts at {utc(start)} and finishes after the deadline "
                                              f"{utc(d.deadline)}: needs {wall_h:.1f} h from now")
    return None


def late_reason(o: Offering, wall_h: float, ctx: "Context") -> str:
    """Why an offer misses the deadline; a spot offer whose loss came from observed lifetimes says so."""
    lived = o.market is Market.SPOT and o.instance.provider in (ctx.spot_lifetimes or {})
    return f"finishes after the deadline: needs {wall_h:.1f} h from now" + (
        " on spot (observed lifetimes)" if lived else "")


# The three results below are NamedTuples: immutable like frozen dataclasses, and several times
# cheaper to create, which matters when a quote creates one per offering.
class CostLines(NamedTuple):
    compute: int
    interruption: int
    storage: int
    data_transfer: int
    sla_risk: int

    @property
    def total(self) -> int:
        return self.compute + self.interruption + self.storage + self.data_transfer + self.sla_risk


class PricedOffer(NamedTuple):
    offering: Offering
    nodes: int
    runtime_hours: float
    cost: CostLines
    zone: str = ""


class ExclusionKind(str, enum.Enum):
    """Why an offering was ruled out, as a kind a program can group by (the sentence says the rest)."""

    SHAPE = "shape"  # GPU model, memory per GPU, node split or interconnect cannot serve the demand
    PROVIDER = "provider"  # the demand does not allow this cloud
    REGION = "region"  # the demand does not allow this region
    RESIDENCY = "residency"  # the region is outside the demand's data residency
    MARKET = "market"  # spot for a job that does not checkpoint
    RESERVATION = "reservation"  # the reservation holds fewer nodes than the demand needs
    SLA = "sla"  # the published SLA is under the demand's minimum
    DEADLINE = "deadline"  # the job would finish after its deadline
    BLOCKED = "blocked"  # a recent capacity/quota error or interruption blocks the scope for now
    QUOTA = "quota"  # the account's remaining quota in the region cannot hold the offer
    NOT_LAUNCHABLE = "not_launchable"  # this broker cannot launch it (a region it is not configured for)

    def __str__(self) -> str:
        return self.value


class Reason(NamedTuple):
    kind: ExclusionKind
    text: str


class Exclusion(NamedTuple):
    offering: Offering
    reason: str  # one sentence
    kind: ExclusionKind


@dataclass(frozen=True, slots=True)
class Context:
    """Everything besides the demand and the offering that a price depends on."""

    terms: dict[str, Terms]
    regions: dict[tuple[str, str], Region]
    gpu_perf: dict[str, float]
    now: float
    onprem_egress_micros_per_gb: int = 0
    # Blocked scopes ("gcp", "aws/us-east-1", "azure/eastus/1", "aws/us-east-1/p5.48xlarge/spot")
    # mapped to the reason they are blocked.
    blocked: dict[str, str] | None = None
    # Nodes of each reservation (by id) that live leases hold beyond what its offering counts.
    held: dict[str, int] | None = None
    # Observed spot lifetimes per provider: the spot line follows them instead of the rate.
    spot_lifetimes: dict[str, LifetimeDist] | None = None


def nodes_for(d: Demand, gpus_per_node: int) -> int | None:
    """How many nodes of this shape serve the demand, or None when the shape cannot."""
    if d.nodes:
        per_node = d.gpus // d.nodes
        return d.nodes if gpus_per_node == per_node else None
    return math.ceil(d.gpus / gpus_per_node)


def runtime_hours(d: Demand, it: InstanceType, nodes: int, gpu_perf: dict[str, float]) -> float:
    """The demand's hours on ``nodes`` nodes of the shape ``it``: stretched for a slower GPU (a
    memory-matched demand) and, across nodes, for a weaker interconnect."""
    h = d.hours
    if not d.gpu_model:
        ref = gpu_perf.get(REFERENCE_GPU, 1.0)
        h *= ref / gpu_perf.get(it.gpu.upper(), ref)
    if nodes > 1:
        per_gpu = it.fabric_gbps / max(1, it.gpus)
        h *= 1.0 + MAX_INTERCONNECT_STRETCH * max(0.0, 1.0 - per_gpu / FULL_SPEED_GBPS_PER_GPU)
    return h


def _blocked(o: Offering, ctx: Context) -> Reason | None:
    if not ctx.blocked:
        return None
    for key in scope_keys(o.instance.provider, o.region, o.instance.name, o.market.value):
        if key in ctx.blocked:
            return Reason(ExclusionKind.BLOCKED, ctx.blocked[key])
    return None


def instance_reason(d: Demand, it: InstanceType) -> tuple[Reason | None, int]:
    """Why the shape ``it`` cannot serve ``d`` whatever the region or market, and its node count."""
    shape = ExclusionKind.SHAPE
    if d.gpu_model and it.gpu.upper() != d.gpu_model:
        return Reason(shape, f"GPU is {it.gpu}, not {d.gpu_model}"), 0
    if it.gpu_memory_gb < d.min_gpu_memory_gb:
        return Reason(shape, f"too little GPU memory: {it.gpu_memory_gb} GB per GPU, "
                             f"demand needs {d.min_gpu_memory_gb} GB"), 0
    nodes = nodes_for(d, it.gpus)
    if nodes is None:
        return Reason(shape, f"{it.gpus} GPUs per node cannot make {d.nodes} nodes of {d.gpus // d.nodes} GPUs"), 0
    if nodes > 1 and it.fabric_gbps < MIN_MULTINODE_GBPS:
        return Reason(shape, f"no interconnect for a {nodes}-node job: {it.interconnect} at "
                             f"{it.fabric_gbps} Gbps (needs >= {MIN_MULTINODE_GBPS})"), nodes
    return None, nodes


def offering_reason(d: Demand, o: Offering, nodes: int, ctx: Context) -> Reason | None:
    """Why this region / market of an otherwise fitting shape cannot serve ``d``."""
    it = o.instance
    if d.providers and it.provider not in d.providers:
        return Reason(ExclusionKind.PROVIDER, f"provider {it.provider} not allowed")
    if d.regions and o.region not in d.regions:
        return Reason(ExclusionKind.REGION, f"region {o.region} not in allowed regions")
    if d.residency:
        reg = ctx.regions.get((it.provider, o.region))
        geo = reg.geo if reg else "?"
        if geo not in d.residency and o.region not in d.residency:
            return Reason(ExclusionKind.RESIDENCY,
                          f"region {o.region} ({geo}) outside data residency {_listed(d.residency)}")
    if o.market is Market.SPOT and not d.interruptible:
        return Reason(ExclusionKind.MARKET, "spot capacity needs an interruptible (checkpointing) job")
    if o.market is Market.RESERVED and o.reservation:
        held = ctx.held.get(o.reservation, 0) if ctx.held else 0
        if nodes > o.reserved_nodes - held:
            free = f"holds {o.reserved_nodes} nodes" if not held else \
                f"has {max(0, o.reserved_nodes - held)} of {o.reserved_nodes} nodes free ({held} held by live leases)"
            return Reason(ExclusionKind.RESERVATION, f"reservation {o.reservation} {free}, demand needs {nodes}")
    if o.quota_left >= 0 and nodes * o.quota_per_node > o.quota_left:
        return Reason(ExclusionKind.QUOTA, f"quota: {o.quota_left:g} of {o.quota_limit:g} {o.quota_label} left "
                                           f"in {o.region}, the offer needs {nodes * o.quota_per_node:g}")
    if d.min_sla_pct and o.sla_pct < d.min_sla_pct:
        sla = "no SLA" if o.sla_pct == 0 else f"SLA {o.sla_pct}%"
        return Reason(ExclusionKind.SLA, f"{sla} is under the minimum {d.min_sla_pct}%")
    if ctx.blocked:
        return _blocked(o, ctx)
    return None


def _transfer_in(d: Demand, o: Offering, ctx: Context, terms: Terms) -> int:
    gb = d.data_in_gb
    if gb <= 0:
        return 0
    if d.data_location == "onprem":
        return int(gb * (ctx.onprem_egress_micros_per_gb + terms.ingress_micros_per_gb))
    src_provider, _, place = d.data_location.partition(":")
    src_region = place.partition(":")[0]  # PROVIDER:REGION[:ZONE]
    src_terms = ctx.terms.get(src_provider)
    if src_terms is None:
        return 0
    if src_provider != o.instance.provider:
        return src_terms.egress_micros(gb) + int(gb * terms.ingress_micros_per_gb)
    if src_region == o.region:
        return 0
    a = ctx.regions.get((src_provider, src_region))
    b = ctx.regions.get((o.instance.provider, o.region))
    same_geo = a is not None and b is not None and a.geo == b.geo
    per_gb = src_terms.inter_region_micros_per_gb if same_geo else src_terms.inter_continent_micros_per_gb
    return int(gb * per_gb)


def pricer(d: Demand, ctx: Context) -> Callable[[Offering], PricedOffer | Exclusion]:
    """``price`` for one demand over many offerings: what depends only on the demand, the
    provider or the region is computed once and reused (a quote prices hundreds of offerings)."""
    transfer_in: dict[tuple[str, str], int] = {}
    egress_out: dict[str, int] = {}
    data_gb = d.data_in_gb + d.data_out_gb
    checkpoint_h = d.checkpoint_hours
    terms_of = ctx.terms
    spot = Market.SPOT
    queued = Market.QUEUED

    shapes: dict[int, tuple[Reason | None, int, float]] = {}  # by id(): hashing a shape costs more

    def price_one(o: Offering) -> PricedOffer | Exclusion:
        it = o.instance
        shape = shapes.get(id(it))
        if shape is None:
            reason, nodes = instance_reason(d, it)
            shape = shapes[id(it)] = (reason, nodes, 0.0 if reason else runtime_hours(d, it, nodes, ctx.gpu_perf))
        reason, nodes, run_h = shape
        if reason is None:
            reason = offering_reason(d, o, nodes, ctx)
        if reason:
            return Exclusion(o, reason.text, reason.kind)
        provider = it.provider
        terms = terms_of[provider]
        gang_hourly = o.hourly_micros * nodes
        compute = int(gang_hourly * run_h)
        startup_h = terms.startup_s / 3600.0

        interruption = 0
        wall_h = run_h + startup_h
        if o.market is spot:
            rate = o.spot_rate if o.spot_rate >= 0 else terms.spot_interruptions_per_hour
            lives = ctx.spot_lifetimes.get(provider) if ctx.spot_lifetimes else None
            lost_h = spot_overhead_h(run_h, nodes, checkpoint_h, startup_h, rate, lives)
            if lost_h == math.inf:
                return Exclusion(o, SHORT_LIVED, ExclusionKind.MARKET)
            interruption = int(lost_h * gang_hourly)
            wall_h += lost_h
        elif o.market is queued:
            wall_h += max(0.0, o.start_after(ctx.now) - ctx.now) / 3600.0
            why = queued_reason(o, run_h, wall_h, d, ctx.now)
            if why is not None:
                return Exclusion(o, why.text, why.kind)
            if o.upfront_micros:  # a block is paid whole, up front, however little of it runs
                compute = o.upfront_micros * nodes

        if d.deadline is not None and ctx.now + wall_h * 3600.0 > d.deadline:
            return Exclusion(o, late_reason(o, wall_h, ctx), ExclusionKind.DEADLINE)

        storage = int(data_gb * terms.storage_micros_per_gb_month * wall_h / HOURS_PER_MONTH) if data_gb else 0
        key = (provider, o.region)
        t_in = transfer_in.get(key)
        if t_in is None:
            t_in = transfer_in[key] = _transfer_in(d, o, ctx, terms)
        t_out = egress_out.get(provider)
        if t_out is None:
            t_out = egress_out[provider] = terms.egress_micros(d.data_out_gb)
        sla_risk = int(compute * lease_down_share(o.sla_pct, nodes)) if o.sla_pct else 0
        return PricedOffer(o, nodes, run_h, CostLines(compute, interruption, storage, t_in + t_out, sla_risk),
                           o.zones[0] if o.zones else "")

    return price_one


def lease_down_share(sla_pct: float, nodes: int) -> float:
    """The chance that a lease of ``nodes`` nodes is hit by a failure at a published availability
    of ``sla_pct`` percent per node: ``1 - a**nodes``, in [0, 1] for any size (one node: exactly
    ``1 - a``). ``expm1``/``log1p`` keep it exact for the small shares a real SLA gives."""
    down = min(1.0, max(0.0, (100.0 - sla_pct) / 100.0))
    if nodes <= 1 or down in (0.0, 1.0):
        return down if nodes >= 1 else 0.0
    return min(1.0, -math.expm1(nodes * math.log1p(-down)))


def price(d: Demand, o: Offering, ctx: Context) -> PricedOffer | Exclusion:
    """Price ``o`` for ``d`` with every cost line, or say why it is excluded."""
    return pricer(d, ctx)(o)


def _listed(names: tuple[str, ...], most: int = 4) -> str:
    """``names`` for a sentence repeated on every excluded offer: the first few, then a count."""
    shown = ",".join(names[:most])
    return shown if len(names) <= most else f"{shown} (+{len(names) - most} more)"
