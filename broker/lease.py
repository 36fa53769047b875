"""The lease: its states, the one table of transitions between them, and the typed record.

The state machine (generated from :data:`TRANSITIONS` by :func:`diagram`; a test keeps the two
in step)::

    requested     ─▶ provisioning | draining | failed
    provisioning  ─▶ requested | running | draining | failed
    running       ─▶ draining
    draining      ─▶ released
    released      (end)
    failed        (end)

``requested``: persisted, no cloud call made yet. ``provisioning``: a launch attempt is in
flight (each attempt is written before its cloud call; a launch abandoned by a crash goes back
to ``requested`` to be resumed with the same client token). ``running``: every node is up and
accrues cost. ``draining``: being torn down; its instances may still exist and still cost.
``released`` and ``failed`` are final.

Every state write goes through :func:`check_transition` (the store calls it inside the write),
so a transition the table does not allow raises :class:`InvalidTransition` instead of being
stored. The sets below are the only definitions of "live", "serving" and "ended".
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields
from typing import Any, Mapping, Sequence

from broker import records
from broker.errors import FailedPrecondition
from broker.records import Attempt, Instance, Job, LaunchPlan, Target
from policies.demand import Demand
from providers.base import Market


class LeaseState(enum.StrEnum):
    """A lease's state. The values are what the store and the JSON output hold."""

    REQUESTED = "requested"
    PROVISIONING = "provisioning"
    RUNNING = "running"
    DRAINING = "draining"
    RELEASED = "released"
    FAILED = "failed"


S = LeaseState


class EventKind(enum.StrEnum):
    """What a lease event records. The values are what the store holds and the JSON prints."""

    STATE_CHANGED = "state_changed"
    INTERRUPTED = "interrupted"
    REQUEUE = "requeue"
    BUDGET = "budget"
    DECISION = "decision"
    HANDOFF = "handoff"
    JOB = "job"
    LIFETIME_WARNING = "lifetime_warning"
    LIFETIME_EXTENDED = "lifetime_extended"
    BUDGET_WARNING = "budget_warning"
    INTERRUPTION_NOTICE = "interruption_notice"
    CAPACITY_BLOCK = "capacity_block"

#: The one table of allowed state changes (a write that keeps the state is not a transition).
TRANSITIONS: dict[LeaseState, frozenset[LeaseState]] = {
    S.REQUESTED: frozenset({S.PROVISIONING, S.DRAINING, S.FAILED}),
    S.PROVISIONING: frozenset({S.REQUESTED, S.RUNNING, S.DRAINING, S.FAILED}),
    S.RUNNING: frozenset({S.DRAINING}),
    S.DRAINING: frozenset({S.RELEASED}),
    S.RELEASED: frozenset(),
    S.FAILED: frozenset(),
}

#: Not ended: may hold cloud instances, is reconciled, counts against a tenant's rate cap.
LIVE: frozenset[LeaseState] = frozenset(s for s, nxt in TRANSITIONS.items() if nxt)
#: Final: nothing of the lease exists in any cloud any more.
ENDED: frozenset[LeaseState] = frozenset(s for s, nxt in TRANSITIONS.items() if not nxt)
#: Serves, or is about to serve, its nodes (a draining lease is being taken away).
SERVING: frozenset[LeaseState] = frozenset({S.REQUESTED, S.PROVISIONING, S.RUNNING})
#: Accrues cost by the hour.
BILLED: frozenset[LeaseState] = frozenset({S.RUNNING, S.DRAINING})
#: Waiting on a launch. A lease is in these from its creation until it runs or ends, and never comes
#: back to them (see TRANSITIONS), so a launch is timed out from ``created_at``.
LAUNCHING: frozenset[LeaseState] = frozenset({S.REQUESTED, S.PROVISIONING})


class InvalidTransition(FailedPrecondition):
    """A state change that :data:`TRANSITIONS` does not allow."""


def check_transition(frm: LeaseState | str, to: LeaseState | str) -> LeaseState:
    """``to`` as a :class:`LeaseState` when ``frm → to`` is allowed (or keeps the state); else raise."""
    a, b = LeaseState(frm), LeaseState(to)
    if a is not b and b not in TRANSITIONS[a]:
        allowed = " | ".join(s.value for s in _ordered(TRANSITIONS[a])) or "nothing (it has ended)"
        raise InvalidTransition(f"a {a.value} lease cannot become {b.value}; it can become {allowed}.")
    return b


def _ordered(states) -> list[LeaseState]:
    order = list(LeaseState)
    return sorted(states, key=order.index)


def diagram() -> str:
    """The state machine as text, one line per state, generated from :data:`TRANSITIONS`."""
    width = max(len(s.value) for s in LeaseState) + 2
    lines = []
    for s in LeaseState:
        nxt = _ordered(TRANSITIONS[s])
        lines.append(f"{s.value:<{width}}" + ("─▶ " + " | ".join(n.value for n in nxt) if nxt else "(end)"))
    return "\n".join(lines)


#: The columns that hold JSON text in the store (:mod:`broker.records` encodes and decodes them).
JSON_FIELDS = ("job", "instances", "demand", "attempts")


@dataclass(slots=True, eq=False)
class Lease:
    """One lease as read from the store: a snapshot, with its JSON columns decoded once into
    the typed records of :mod:`broker.records`.

    Change it only through the lifecycle (the store checks the version it was read at and the
    transition). ``job``: the job it carries (an empty :class:`Job` for none). ``instances``: its
    cloud instances. ``demand`` and ``alternatives``: the demand it was quoted for and the ranked
    offers for failover and replacement (None and () for an explicit launch; both are kept in the
    one ``demand`` column). ``attempts``: its failed launch attempts.
    """

    lease_id: str
    idempotency_key: str
    state: LeaseState
    provider: str
    region: str
    instance_type: str
    market: Market
    nodes: int
    hourly_micros: int  # per node
    client_token: str  # the cloud-side idempotency token of the current launch attempt
    created_at: float
    updated_at: float
    state_since: float  # when the current state was entered
    tenant: str = "default"
    state_reason: str = ""
    version: int = 1
    zone: str = ""
    reservation: str = ""
    attempt: int = 0
    quote_id: str = ""
    offer_rank: int = 0
    bootstrap: str = ""
    job: Job = field(default_factory=Job)
    instances: tuple[Instance, ...] = ()
    demand: Demand | None = None
    attempts: tuple[Attempt, ...] = ()
    started_at: float = 0.0  # first time running
    ended_at: float = 0.0
    accrued_micros: int = 0  # spend accrued up to accrued_at
    accrued_at: float = 0.0
    max_lifetime_s: int = 0
    idle_since: float = 0.0
    replaces: str = ""  # lease id this one replaces after an interruption
    job_state: str = ""  # the attached job's (broker.jobs.JobState), "" without one
    alternatives: tuple[Target, ...] = ()  # failover offers after this one, rank order
    starts_at: float = 0.0  # the start of the Capacity Block bought for it (0 = none bought)

    def __post_init__(self) -> None:
        self.state = LeaseState(self.state)
        self.market = Market(self.market)
        if not isinstance(self.job, Job) or isinstance(self.demand, Mapping) or any(
                not isinstance(r, (Instance, Attempt)) for r in (*self.instances, *self.attempts)):
            # given as plain values (the columns' JSON layout): the typed records of them
            for k, v in decode(encode({"job": self.job, "instances": self.instances, "attempts": self.attempts,
                                       "demand": self.demand, "alternatives": self.alternatives})).items():
                setattr(self, k, v)
        self.instances, self.attempts = tuple(self.instances), tuple(self.attempts)

    def __repr__(self) -> str:
        return f"Lease({self.lease_id!r}, {self.state.value}, v{self.version})"

    @classmethod
    def from_row(cls, columns: Sequence[str], values: Sequence[Any]) -> "Lease":
        """A lease from a store row (``columns`` names ``values``); JSON columns are decoded here."""
        return cls(**decode(dict(zip(columns, values))))

    def to_row(self) -> dict[str, Any]:
        """The store's column values (JSON columns encoded)."""
        return encode({f.name: getattr(self, f.name) for f in fields(self)})

    @property
    def instance_ids(self) -> set[str]:
        return {i.instance_id for i in self.instances}

    @property
    def target(self) -> Target:
        """The offering the lease holds (or is launching on)."""
        return Target(self.provider, self.region, self.zone, self.instance_type, self.market, self.nodes,
                      self.hourly_micros, self.reservation)

    @property
    def plan(self) -> LaunchPlan:
        return LaunchPlan(demand=self.demand, alternatives=self.alternatives)

    @property
    def rate_micros(self) -> int:
        """Micro-dollars per hour for the whole lease."""
        return self.hourly_micros * self.nodes


def decode(row: Mapping[str, Any]) -> dict[str, Any]:
    """A store row's values as a Lease's fields: the JSON columns as typed records."""
    d = dict(row)
    if "job" in d:
        d["job"] = records.decode(d["job"] or "{}", Job)
    if "instances" in d:
        d["instances"] = records.decode(d["instances"] or "[]", tuple[Instance, ...])
    if "attempts" in d:
        d["attempts"] = records.decode(d["attempts"] or "[]", tuple[Attempt, ...])
    if "demand" in d:
        plan = records.plan_from(d["demand"] or "{}")
        d["demand"], d["alternatives"] = plan.demand, plan.alternatives
    return d


def encode(values: Mapping[str, Any]) -> dict[str, Any]:
    """Column values for the store: the typed records (or their plain values) become the JSON
    text of :mod:`broker.records`, a demand and its alternatives the one ``demand`` column."""
    out = dict(values)
    if "job" in out and not isinstance(out["job"], str):
        out["job"] = records.encode(records.convert(records.to_builtins(out["job"]), Job))
    for k, kind in (("instances", Instance), ("attempts", Attempt)):
        if k in out and not isinstance(out[k], str):
            out[k] = records.encode([records.convert(records.to_builtins(v), kind) for v in out[k]])
    if "demand" in out and not isinstance(out["demand"], str):
        demand, alternatives = out["demand"], tuple(out.pop("alternatives", ()))
        if isinstance(demand, Mapping):  # plain values: the column's own layout
            plan = records.plan_from(demand)
            demand, alternatives = plan.demand, alternatives or plan.alternatives
        out["demand"] = records.plan_to_json(LaunchPlan(demand=demand, alternatives=alternatives))
    elif "alternatives" in out:
        raise ValueError("a lease's alternatives are written with its demand (one column)")
    if "state" in out:
        out["state"] = LeaseState(out["state"]).value
    if "market" in out:
        out["market"] = Market(out["market"]).value
    return out


def cost_so_far(lease: Any, now: float) -> int:
    """Micro-dollars spent by ``lease`` up to ``now``: what was accrued, plus the time since at its
    rate while it is billed. ``lease`` is anything with the lease's money columns."""
    cost = lease.accrued_micros
    if lease.state in BILLED and lease.accrued_at:
        cost += int(lease.hourly_micros * lease.nodes * max(0.0, now - lease.accrued_at) / 3600.0)
    return cost
