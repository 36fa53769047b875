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
import json
from dataclasses import dataclass, field, fields
from typing import Any, Mapping, Sequence

from broker.errors import FailedPrecondition


class LeaseState(enum.StrEnum):
    """A lease's state. The values are what the store and the JSON output hold."""

    REQUESTED = "requested"
    PROVISIONING = "provisioning"
    RUNNING = "running"
    DRAINING = "draining"
    RELEASED = "released"
    FAILED = "failed"


S = LeaseState

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


#: The columns that hold JSON text in the store and decoded values on a :class:`Lease`.
JSON_FIELDS = ("job", "instances", "demand", "attempts")


@dataclass(slots=True, eq=False)
class Lease:
    """One lease as read from the store: a snapshot, with its JSON columns decoded once.

    Change it only through the lifecycle (the store checks the version it was read at and the
    transition). ``job``: job_id, owner, queue, checkpoint_uri, dataset_uri, env, node_names.
    ``instances``: instance dicts (instance_id, node_name, zone, private_ip, state, region).
    ``demand``: the demand and ranked alternatives for failover and replacement ({} for an
    explicit launch). ``attempts``: failed launch attempts (provider, code, scope, message).
    """

    lease_id: str
    idempotency_key: str
    state: LeaseState
    provider: str
    region: str
    instance_type: str
    market: str
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
    job: dict[str, Any] = field(default_factory=dict)
    instances: list[dict[str, Any]] = field(default_factory=list)
    demand: dict[str, Any] = field(default_factory=dict)
    attempts: list[dict[str, Any]] = field(default_factory=list)
    started_at: float = 0.0  # first time running
    ended_at: float = 0.0
    accrued_micros: int = 0  # spend accrued up to accrued_at
    accrued_at: float = 0.0
    max_lifetime_s: int = 0
    idle_since: float = 0.0
    replaces: str = ""  # lease id this one replaces after an interruption
    job_state: str = ""  # the attached job's (broker.jobs.JobState), "" without one

    def __post_init__(self) -> None:
        self.state = LeaseState(self.state)

    def __repr__(self) -> str:
        return f"Lease({self.lease_id!r}, {self.state.value}, v{self.version})"

    @classmethod
    def from_row(cls, columns: Sequence[str], values: Sequence[Any]) -> "Lease":
        """A lease from a store row (``columns`` names ``values``); JSON columns are decoded here."""
        d = dict(zip(columns, values))
        for k in JSON_FIELDS:
            if k in d and isinstance(d[k], str):
                d[k] = json.loads(d[k])
        return cls(**d)

    def to_row(self) -> dict[str, Any]:
        """The store's column values (JSON columns encoded)."""
        return encode({f.name: getattr(self, f.name) for f in fields(self)})

    @property
    def instance_ids(self) -> set[str]:
        return {i["instance_id"] for i in self.instances}

    @property
    def rate_micros(self) -> int:
        """Micro-dollars per hour for the whole lease."""
        return self.hourly_micros * self.nodes


def encode(values: Mapping[str, Any]) -> dict[str, Any]:
    """Column values for the store: JSON fields given as Python values become JSON text."""
    out = dict(values)
    for k in JSON_FIELDS:
        if k in out and not isinstance(out[k], str):
            out[k] = json.dumps(out[k])
    if "state" in out:
        out["state"] = LeaseState(out["state"]).value
    return out


def cost_so_far(lease: Any, now: float) -> int:
    """Micro-dollars spent by ``lease`` up to ``now``: what was accrued, plus the time since at its
    rate while it is billed. ``lease`` is anything with the lease's money columns."""
    cost = lease.accrued_micros
    if lease.state in BILLED and lease.accrued_at:
        cost += int(lease.hourly_micros * lease.nodes * max(0.0, now - lease.accrued_at) / 3600.0)
    return cost
