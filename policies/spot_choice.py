"""One spot choice for the quote and the simulator: may this job start on this spot offer?

With observed lifetimes for the offer's cloud, a spot offer is taken only if the job, run on spot
to the end (every preemption, restart and lost partial checkpoint counted, by
:func:`policies.spot.outlook`), finishes by its deadline with the model's ``confidence`` (90 %
by default; Cantelli's bound, whatever the distribution's shape). A demand that names no deadline
is held to start-up + runtime x (1 + ``deadline_slack``): twice its runtime by default, the same
rule the simulator's ``broker`` policy is credited with. Without lifetimes for the cloud (only a
mean interruption rate) the cost model's expected loss is all there is, and the offer stands.

Pure: the deadline arrives as hours from now; no clock is read.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, NamedTuple, Sequence

from providers.base import Market

from policies.cost import Exclusion, ExclusionKind, PricedOffer
from policies.spot import LifetimeDist, outlook

DEFAULT_CONFIDENCE = 0.9
DEFAULT_DEADLINE_SLACK = 1.0


@dataclass(frozen=True)
class SpotModel:
    """What spot is judged by: per cloud, observed lifetimes (where known; the rest by their
    interruption rates), the confidence a spot finish must have, the implied deadline's slack,
    and a sentence saying where the lifetimes came from (the quote's ``spot_model``)."""

    lifetimes: Mapping[str, LifetimeDist] = field(default_factory=dict)
    confidence: float = DEFAULT_CONFIDENCE
    deadline_slack: float = DEFAULT_DEADLINE_SLACK
    source: str = "catalog rates"

    def __post_init__(self) -> None:
        if not 0.0 < self.confidence < 1.0:
            raise ValueError(f"confidence must be between 0 and 1 (exclusive), got {self.confidence}")
        if not self.deadline_slack >= 0.0:
            raise ValueError(f"deadline_slack must be zero or more, got {self.deadline_slack}")

    @property
    def observed(self) -> bool:
        return bool(self.lifetimes)


class SpotVerdict(NamedTuple):
    in_time: bool
    finish_h: float  # the finish met with the model's confidence (hours from now)
    deadline_h: float


def verdict(p: PricedOffer, model: SpotModel, startup_h: float, checkpoint_h: float,
            deadline_h: float | None) -> SpotVerdict | None:
    """Whether spot offer ``p`` finishes by ``deadline_h`` (hours from now; None: start-up +
    runtime x (1 + slack)) with the model's confidence; None when the rule does not apply (not
    spot, or no lifetimes for its cloud)."""
    if p.offering.market is not Market.SPOT:
        return None
    dist = model.lifetimes.get(p.offering.instance.provider)
    if dist is None:
        return None
    if deadline_h is None:
        deadline_h = startup_h + p.runtime_hours * (1.0 + model.deadline_slack)
    o = outlook(dist, p.runtime_hours, checkpoint_h, startup_h, p.nodes)
    finish = o.finish_by_h(model.confidence)
    return SpotVerdict(finish <= deadline_h, finish, deadline_h)


def late_on_spot(priced: Sequence[PricedOffer], model: SpotModel, startup_h: Mapping[str, float],
                 checkpoint_h: float, deadline_h: float | None) -> tuple[list[PricedOffer], list[Exclusion]]:
    """``priced`` (order kept) without the spot offers that would not finish in time, and those
    as exclusions saying why. ``startup_h``: per provider."""
    if not model.lifetimes:
        return list(priced), []
    keep: list[PricedOffer] = []
    out: list[Exclusion] = []
    pct = f"{model.confidence * 100:g} %"
    for p in priced:
        v = verdict(p, model, startup_h.get(p.offering.instance.provider, 0.0), checkpoint_h, deadline_h)
        if v is None or v.in_time:
            keep.append(p)
            continue
        if v.finish_h == float("inf"):
            why = (f"on spot it never finishes: its nodes do not live to a checkpoint (observed lifetimes), "
                   f"and the deadline is {v.deadline_h:.1f} h")
        else:
            why = (f"on spot it finishes by {v.finish_h:.1f} h with {pct} confidence (observed lifetimes), "
                   f"after the deadline of {v.deadline_h:.1f} h")
        out.append(Exclusion(p.offering, why, ExclusionKind.DEADLINE))
    return keep, out


def first_choice(priced: Sequence[PricedOffer], model: SpotModel, startup_h: Mapping[str, float],
                 checkpoint_h: float, deadline_h: float | None = None) -> PricedOffer | None:
    """Where the job goes: the lowest full cost among the offers it may start on (reserved
    capacity first, as the quote ranks), or None."""
    ok, _ = late_on_spot(priced, model, startup_h, checkpoint_h, deadline_h)
    if not ok:
        return None
    return min(ok, key=lambda p: (p.offering.market is not Market.RESERVED, p.cost.total))
