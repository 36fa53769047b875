"""A lease's launch attempts: each as the record a lease keeps, and all of them in the one line a
failed launch reports (each distinct reason once)."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from broker.errors import FailedPrecondition
from broker.lease import Lease
from broker.quote import Target
from providers.base import ProviderError


def attempts_summary(attempts: Sequence[Mapping[str, Any]], shown: int = 2) -> str:
    """The launch attempts in one line, each distinct reason once (the provider's own code, the
    scope it blocked, its sentence) with where it happened: the first ``shown`` offers and how
    many more (the lease's ``attempts`` list every one)."""
    groups: dict[tuple, list[str]] = {}
    for a in attempts:
        where = (f"{a['provider']}/{a['region']}{'/' + a['zone'] if a.get('zone') else ''}/"
                 f"{a['instance_type']}/{a['market']}")
        groups.setdefault((a["code"], a["scope"] or "skipped", a["message"]), []).append(where)
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


def attempt_record(t: Target, e: ProviderError) -> dict:
    return {"provider": t.provider, "region": t.region, "zone": t.zone, "instance_type": t.instance_type,
            "market": t.market.value, "code": e.code or type(e).__name__, "scope": e.scope_key,
            "kind": type(e).__name__.removesuffix("Error").lower(), "message": e.message[:300]}
