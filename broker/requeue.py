"""What a lost lease leaves behind: its job requeued from the last checkpoint on a replacement
quoted for the work left, or failed past ``max_restarts``; never dropped in silence.

One path for every loss — a spot interruption, an instance terminated from outside, a host
failure, an instance that vanished, a lease at its maximum lifetime or its tenant's budget —
called by the reconciler (:mod:`broker.reconciler`) and, before the loss, by an interruption
notice (:mod:`broker.interruption`). Each step is idempotent: the replacement's idempotency key
is ``replace-<lease>``, so a crash anywhere repeats the whole step without a second replacement.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import structlog

from broker.jobs import ENDED_JOB, JobState, Requeue, plan_requeue
from broker import records
from broker.lease import EventKind, Lease
from broker.lifecycle import LeaseError, Lifecycle
from providers.base import offering_key

log = structlog.get_logger("broker.requeue")


@dataclasses.dataclass(frozen=True)
class Loss:
    """Why a lease is being lost: ``cause`` in a few words ("spot interruption", "outside
    termination", "maximum lifetime", ...), the cloud's own ``detail``, whether the offering is
    blocked for ``[lifecycle] interruption_block_s``, and whether a replacement may be launched."""

    cause: str
    detail: str = ""
    block: bool = False
    replace: bool = True


def handle_loss(lc: Lifecycle, lease: Lease, loss: Loss, now: float, *,
                drain: bool = True) -> tuple[Lease, Lease | None]:
    """Requeue (or fail) ``lease``'s job and record the replacement; then, in one write, move the
    lease to draining with its ``interrupted``, ``requeue`` and ``job`` events (``drain=False``:
    the lease keeps running, as after a notice; the events are written all the same)."""
    key = offering_key(lease.provider, lease.region, lease.instance_type, lease.market)
    if loss.block:
        lc.store.block(key, now + lc.settings.interruption_block_s, f"spot interruption on {key}")
    plan = plan_requeue(lease, loss.cause, lc.settings.max_restarts)
    replacement, why_none = None, ""
    earlier = lease.job.replaced_by
    if earlier:  # requeued already, at a notice: that replacement stands
        plan, replacement = None, lc.store.get_lease(earlier)
        why_none = f"replacement {earlier} was requested at the notice"
    elif lease.job_state in ENDED_JOB:  # its job is done: nothing to run on a replacement
        why_none = f"its job {lease.job.job_id} had {lease.job_state}"
    elif plan is not None and plan.failed:
        why_none = plan.failed
    elif not loss.replace:
        why_none = f"{loss.cause}: no new spend"
    else:
        replacement, why_none = replace(lc, lease, now, plan)
    outcome = (f"replacement lease {replacement.lease_id} requested" if replacement is not None
               else f"no replacement: {why_none}")
    data: dict[str, Any] = {"cause": loss.cause, "detail": loss.detail, "blocked": key if loss.block else "",
                            "replacement": replacement.lease_id if replacement is not None else ""}
    events, fields = _job_events(lease, plan, outcome, data) if not earlier else ([], {})
    reason = f"{loss.cause}: {loss.detail}; {outcome}" if loss.detail else f"{loss.cause}; {outcome}"
    if drain:
        lease = lc.drain(lease, reason, event_kind=EventKind.INTERRUPTED, event_data=data, events=events, **fields)
    else:
        lease = lc.store.update_lease(lease, now=now, events=events, **fields)
    log.warning("lease_lost", lease=lease.lease_id, provider=lease.provider, cause=loss.cause,
                detail=loss.detail, replacement=data["replacement"], job=lease.job.job_id)
    return lease, replacement


def _job_events(lease: Lease, plan: Requeue | None, outcome: str,
                data: dict[str, Any]) -> tuple[list[tuple[EventKind, str, dict]], dict[str, Any]]:
    """The ``requeue`` / ``job`` events of a loss and the lease's job fields after it."""
    job = lease.job
    if not job.job_id or job.state in ENDED_JOB:
        return [], {}
    if plan is not None and plan.failed:
        failed = job.with_(state=str(JobState.FAILED))
        return ([(EventKind.JOB, plan.failed, {**data, "job": records.to_builtins(failed), "state": str(JobState.FAILED)})],
                {"job": failed, "job_state": str(JobState.FAILED)})
    ckpt = job.checkpoint_uri or "(none)"
    cause = data["cause"]
    hours = plan.sentence_hours if plan is not None else ""
    message = f"job {job.job_id} requeued from checkpoint {ckpt} after {cause}{hours}; {outcome}"
    payload = {**data, "job": records.to_builtins(job)}
    if plan is not None:
        payload.update(restarts=plan.job.restarts, hours_left=plan.hours)
    return [(EventKind.REQUEUE, message, payload)], {"job": job.with_(checkpoint_requested=True,
                                                              replaced_by=data["replacement"])}


def replace(lc: Lifecycle, lease: Lease, now: float, plan: Requeue | None) -> tuple[Lease | None, str]:
    """A replacement lease (state requested) for ``lease``: quoted afresh for the work left
    without the blocked offerings when the demand is known, else on the lease's own offering
    when that is not blocked; or None and why not."""
    job = plan.job if plan is not None else lease.job
    demand = lease.demand
    if demand is not None:
        if plan is not None and plan.hours is not None:
            demand = dataclasses.replace(demand, hours=plan.hours)
        q = lc.engine.quote(demand, now=now, blocked=lc.store.active_blocks(now))
        if not q.offers:
            return None, "every offer is excluded now"
        targets = list(q.targets(lc.settings.max_failover))
        first, rest, quote_id = targets[0], targets[1:], q.quote_id
    elif plan is not None:  # a job on named capacity: the same capacity again, unless it is blocked
        first, rest, quote_id, demand = lease.target, [], "", None
        blocked = lc._blocked_reason(first)
        if blocked:
            return None, f"its offering is {blocked[1]}"
    else:
        return None, "launched without a demand (explicit offering)"
    try:
        new, _ = lc.create(
            idempotency_key=f"replace-{lease.lease_id}", target=first, tenant=lease.tenant, demand=demand,
            alternatives=rest, quote_id=quote_id, offer_rank=1 if quote_id else 0, job=job,
            bootstrap=lease.bootstrap, max_lifetime_s=lease.max_lifetime_s, replaces=lease.lease_id,
        )
    except LeaseError as e:
        return None, str(e)
    return new, ""
