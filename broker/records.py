"""The lease's inner records, typed, and the ONE codec that stores them.

A lease row keeps four JSON columns (``instances``, ``job``, ``demand``, ``attempts``); they are
written and read here and nowhere else, as msgspec Structs:

- :class:`Instance`: one cloud instance of the lease (its node name, zone, address, state);
- :class:`Job`: the job the lease carries (the hand-off's fields and what the broker keeps about
  it: reports, checkpoints, requeues; see :mod:`broker.jobs`);
- :class:`Attempt`: one failed launch attempt (where, the provider's own code, the scope it
  blocked, its sentence);
- the ``demand`` column: the lease's :class:`policies.demand.Demand` (None for an explicit launch)
  and its failover alternatives as :class:`broker.targets.Target` s, in rank order.

A Demand is stored by this codec in a lease and in a stored quote alike. The stored JSON keeps
the keys and string values of earlier releases (market ``"on_demand"``, instance state
``"running"``), so rows written before these types decode unchanged; a Demand's deadline written
as RFC 3339 text by earlier releases is read back as epoch seconds.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence, TypeVar

import msgspec
from msgspec import Struct

from broker.targets import Target
from broker.times import parse_iso
from policies.demand import Demand
from providers.base import InstanceState, Market

T = TypeVar("T")


class Instance(Struct, frozen=True, kw_only=True):
    """One cloud instance of a lease, as the lease records it."""

    instance_id: str
    node_name: str = ""
    zone: str = ""
    private_ip: str = ""
    state: InstanceState = InstanceState.PENDING
    region: str = ""


class Attempt(Struct, frozen=True, kw_only=True):
    """One failed launch attempt of a lease. ``code``: the provider's own error code (or
    ``blocked``, ``BootScript``); ``scope``: the offering, zone or region it blocked ("" =
    none); ``kind``: the error's kind (capacity, quota, auth, invalid, blocked, ...)."""

    provider: str
    region: str
    zone: str = ""
    instance_type: str = ""
    market: Market = Market.ON_DEMAND
    code: str = ""
    scope: str = ""
    kind: str = ""
    message: str = ""

    @property
    def where(self) -> str:
        zone = f"/{self.zone}" if self.zone else ""
        return f"{self.provider}/{self.region}{zone}/{self.instance_type}/{self.market.value}"


class Job(Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The job a lease carries. The hand-off's fields (``job_id`` … ``env``; ``node_names`` for
    a Slurm hand-off, whose nodes the scheduler runs), then what the broker keeps about it
    (:mod:`broker.jobs`): the latest report, the latest checkpoint and the work it saved, the
    requeues, and the marks of a lease's announced end. An empty Job: the lease carries none."""

    job_id: str = ""
    owner: str = ""
    queue: str = ""
    checkpoint_uri: str = ""
    dataset_uri: str = ""
    env: dict[str, str] = msgspec.field(default_factory=dict)
    node_names: tuple[str, ...] = ()
    source: str = ""  # who attached it ("" = the launch or a hand-off)
    # the latest report
    state: str = ""  # broker.jobs.JobState value ("" = none reported yet)
    exit_code: int | None = None
    progress: float | None = None
    reported_at: float = 0.0
    attached_at: float = 0.0  # when a report attached it (a lease launched without a job)
    # the latest checkpoint and the work it saved, in seconds (on every lease it ran on)
    checkpoint_at: float = 0.0
    work_done_s: float = 0.0
    # requeues: how often, the most, the work saved when it came to this lease, the whole job's hours
    restarts: int = 0
    max_restarts: int | None = None
    base_done_s: float = 0.0
    total_hours: float = 0.0
    # the lease's end was announced: save now; the replacement requested for it
    checkpoint_requested: bool = False
    lifetime_warned: bool = False
    notice_at: float = 0.0
    replaced_by: str = ""

    def __bool__(self) -> bool:
        return self != _NO_JOB

    def with_(self, **changes: Any) -> "Job":
        """This job with ``changes`` (a new record: a Job is never changed in place)."""
        return msgspec.structs.replace(self, **changes)


_NO_JOB = Job()


class LaunchPlan(Struct, frozen=True, kw_only=True):
    """The ``demand`` column: the demand a lease was quoted for and its failover alternatives."""

    demand: Demand | None = None
    alternatives: tuple[Target, ...] = ()  # rank order


def replace(record: Any, **changes: Any) -> Any:
    """``record`` (an Instance, Attempt or Job) with ``changes``: a new record."""
    return msgspec.structs.replace(record, **changes)


@dataclass(frozen=True)
class ExplicitOffer:
    """Capacity named by hand instead of by a quote's offer."""

    provider: str
    region: str
    zone: str
    instance_type: str
    market: str  # on_demand | spot | reserved (checked against the catalog: Lifecycle.target_explicit)
    count: int


@dataclass(frozen=True)
class LaunchOrder:
    """A Launch as the domain sees it: one of ``quote_id``/``rank`` or ``offer``, and the rest."""

    idempotency_key: str
    tenant: str = "default"
    quote_id: str = ""
    rank: int = 0
    offer: ExplicitOffer | None = None
    job: Job = field(default_factory=Job)
    node_names: Sequence[str] = ()
    bootstrap: str = ""
    max_lifetime_s: int = 0
    max_restarts: int | None = None  # None: [lifecycle] max_restarts


# -- the one codec --------------------------------------------------------------------------------

_encoder = msgspec.json.Encoder()


def encode(value: Any) -> str:
    """``value`` (a record, a list of them, a Demand, a plan) as the JSON text the store keeps."""
    return _encoder.encode(value).decode()


def to_builtins(value: Any) -> Any:
    """``value`` as plain JSON values (the API's and the events' one JSON dialect)."""
    return msgspec.to_builtins(value)


def decode(text: str | bytes | Any, kind: type[T]) -> T:
    """A stored column (JSON text, or values already decoded) as ``kind``."""
    raw = msgspec.json.decode(text) if isinstance(text, (str, bytes)) else text
    return convert(raw, kind)


def convert(raw: Any, kind: type[T]) -> T:
    """Plain JSON values as ``kind`` (ValueError naming the field when they do not fit)."""
    try:
        return msgspec.convert(raw, kind)
    except msgspec.ValidationError as e:
        raise ValueError(str(e)) from None


def demand_from(raw: Any) -> Demand:
    """A stored Demand (this codec's, or an earlier release's with an RFC 3339 deadline)."""
    if isinstance(raw, dict) and isinstance(raw.get("deadline"), str):
        raw = {**raw, "deadline": parse_iso(raw["deadline"])}
    return convert(raw, Demand)


def decode_stored_quote(body: str | bytes, kind: type[T]) -> T:
    """A stored quote (:class:`broker.quote.StoredQuote`) from its JSON text."""
    raw = msgspec.json.decode(body)
    if isinstance(raw, dict) and isinstance(raw.get("demand"), dict):
        raw["demand"] = to_builtins(demand_from(raw["demand"]))
    return convert(raw, kind)


def plan_from(raw: Any) -> LaunchPlan:
    """The ``demand`` column: ``{}`` (an explicit launch), or the demand's fields beside
    ``alternatives`` (the layout of every release)."""
    d = msgspec.json.decode(raw) if isinstance(raw, (str, bytes)) else dict(raw or {})
    if not isinstance(d, dict):
        raise ValueError(f"a lease's demand column holds an object, not {type(d).__name__}")
    alts = tuple(convert(a, Target) for a in d.pop("alternatives", ()) or ())
    return LaunchPlan(demand=demand_from(d) if d.get("gpus") else None, alternatives=alts)


def plan_to_json(plan: LaunchPlan) -> str:
    """The ``demand`` column for ``plan`` (``{}`` without a demand or alternatives; named
    capacity with failover alternatives keeps only those)."""
    if plan.demand is None:
        return encode({"alternatives": to_builtins(plan.alternatives)}) if plan.alternatives else "{}"
    return encode({**to_builtins(plan.demand), "alternatives": to_builtins(plan.alternatives)})
