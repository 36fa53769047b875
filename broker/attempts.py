"""A lease's launch attempts: each as the record a lease keeps (:class:`broker.records.Attempt`),
and all of them in the one line a failed launch reports (each distinct reason once)."""
from __future__ import annotations

from typing import Callable, Sequence

import structlog
import tenacity

from broker.errors import FailedPrecondition
from broker.lease import Lease
from broker.records import Attempt, Target
from providers.base import Instance, InstanceState, Market, ProviderError, Scope

log = structlog.get_logger("broker.lifecycle")


def launch_tries(tries: int, backoff_s: float, sleep: Callable[[float], None], *, lease: str,
                 provider: str) -> tenacity.Retrying:
    """The calls of one launch request: at most ``tries`` (at least one), a retryable
    :class:`ProviderError` (throttling, 5xx) calling again after ``backoff_s``, doubled each time;
    any other error, or the last call's, is raised as it is. Used as ``for call in
    launch_tries(...): with call: ...``."""
    def said(state: tenacity.RetryCallState) -> None:
        log.info("launch_retry", lease=lease, provider=provider, delay_s=state.upcoming_sleep)

    return tenacity.Retrying(
        stop=tenacity.stop_after_attempt(max(1, tries)),
        wait=tenacity.wait_exponential(multiplier=backoff_s),
        retry=tenacity.retry_if_exception(lambda e: isinstance(e, ProviderError) and e.retryable),
        sleep=sleep, before_sleep=said, reraise=True)


def attempts_summary(attempts: Sequence[Attempt], shown: int = 2) -> str:
    """The launch attempts in one line, each distinct reason once (the provider's own code, the
    scope it blocked, its sentence) with where it happened: the first ``shown`` offers and how
    many more (the lease's ``attempts`` list every one)."""
    groups: dict[tuple, list[str]] = {}
    for a in attempts:
        groups.setdefault((a.code, a.scope or "skipped", a.message), []).append(a.where)
    parts = []
    for (code, scope, message), wheres in groups.items():
        wheres = list(dict.fromkeys(wheres))
        more = f" and {len(wheres) - shown} more" if len(wheres) > shown else ""
        parts.append(f"{code} ({scope}) {message} [{', '.join(wheres[:shown])}{more}]")
    return "; ".join(parts)


def launch_failure(lease: Lease) -> FailedPrecondition:
    """The error of a launch that failed for good (every offer tried or ruled out), with its
    attempts: FAILED_PRECONDITION, not a retryable UNAVAILABLE — the same request fails again;
    a new quote (or a new key) is what can help."""
    return FailedPrecondition(f"lease {lease.lease_id} could not be launched: "
                              f"{attempts_summary(lease.attempts) or lease.state_reason}", attempts=lease.attempts)


def attempt_at(t: Target, code: str, scope: str, kind: str, message: str) -> Attempt:
    """An attempt on ``t`` that did not reach the cloud, or failed with ``code``."""
    return Attempt(provider=t.provider, region=t.region, zone=t.zone, instance_type=t.instance_type,
                   market=t.market, code=code, scope=scope, kind=kind, message=message)


def attempt_record(t: Target, e: ProviderError) -> Attempt:
    """The attempt on ``t`` that the cloud refused with ``e``."""
    return attempt_at(t, e.code or type(e).__name__, e.scope_key, type(e).__name__.removesuffix("Error").lower(),
                      e.message[:300])


#: The markets one request may launch several shapes of (an EC2 Fleet, a GCP bulkInsert).
FLEET_MARKETS = (Market.ON_DEMAND, Market.SPOT)


class ProviderFault(ProviderError):
    """A provider raised what no provider error covers (a bug, an SDK's surprise) during a launch:
    the offer fails at once, naming the provider and the exception's class (the traceback goes to
    the log only), and the launch fails over to the next cloud instead of staying provisioning."""

    default_scope = Scope.CLOUD


def alive(i: Instance) -> bool:
    return i.state in (InstanceState.PENDING, InstanceState.RUNNING)
