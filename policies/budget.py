"""Budget caps per tenant: $/hour (sum of live leases' rates) and $/month (accrued spend). Pure."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from providers.base import MICROS


@dataclass(frozen=True, slots=True)
class Caps:
    usd_per_hour_micros: int | None = None
    usd_per_month_micros: int | None = None


def launch_refusal(tenant: str, caps: Caps, live_rate_micros: int, month_spend_micros: int,
                   new_rate_micros: int) -> str | None:
    """The sentence refusing a launch that would break a cap, or None when it fits."""
    if caps.usd_per_hour_micros is not None and live_rate_micros + new_rate_micros > caps.usd_per_hour_micros:
        return (f"budget {tenant}.usd_per_hour = {caps.usd_per_hour_micros / MICROS:g} would be exceeded: "
                f"{live_rate_micros / MICROS:.2f} $/h already running + {new_rate_micros / MICROS:.2f} $/h requested")
    if caps.usd_per_month_micros is not None and month_spend_micros >= caps.usd_per_month_micros:
        return (f"budget {tenant}.usd_per_month = {caps.usd_per_month_micros / MICROS:g} is spent: "
                f"{month_spend_micros / MICROS:.2f} $ accrued this month")
    return None


def purchase_refusal(tenant: str, caps: Caps, month_spend_micros: int, fee_micros: int) -> str | None:
    """The sentence refusing a purchase paid up front (a Capacity Block's whole fee) that the
    month's budget does not cover, or None when it fits (or no month cap is set)."""
    cap = caps.usd_per_month_micros
    if cap is not None and month_spend_micros + fee_micros > cap:
        return (f"budget {tenant}.usd_per_month = {cap / MICROS:g} does not cover the capacity block's "
                f"{fee_micros / MICROS:.2f} $ paid up front: {month_spend_micros / MICROS:.2f} $ accrued this month")
    return None


def over_budget(tenant: str, caps: Caps, live_rate_micros: int, month_spend_micros: int) -> str | None:
    """Why running leases must be released now (None when within budget)."""
    if caps.usd_per_month_micros is not None and month_spend_micros >= caps.usd_per_month_micros:
        return (f"budget {tenant}.usd_per_month = {caps.usd_per_month_micros / MICROS:g} exhausted "
                f"({month_spend_micros / MICROS:.2f} $ accrued)")
    if caps.usd_per_hour_micros is not None and live_rate_micros > caps.usd_per_hour_micros:
        return (f"budget {tenant}.usd_per_hour = {caps.usd_per_hour_micros / MICROS:g} exceeded "
                f"({live_rate_micros / MICROS:.2f} $/h running)")
    return None


def to_release(tenant: str, caps: Caps, running: Sequence[tuple[str, int]], live_rate_micros: int,
               month_spend_micros: int) -> dict[str, str]:
    """Running leases to release now, by id, with the sentence naming the cap they break.

    ``running`` is (lease id, rate in micro-dollars per hour), oldest first. A spent month
    releases them all; a rate over ``usd_per_hour`` (a cap lowered, two launches that raced)
    releases the newest until the rest fits.
    """
    if caps.usd_per_month_micros is not None and month_spend_micros >= caps.usd_per_month_micros:
        why = over_budget(tenant, caps, live_rate_micros, month_spend_micros)
        assert why is not None  # the same test as over_budget's first
        return {lease_id: why for lease_id, _ in running}
    out: dict[str, str] = {}
    if caps.usd_per_hour_micros is not None and live_rate_micros > caps.usd_per_hour_micros:
        why = over_budget(tenant, caps, live_rate_micros, month_spend_micros)
        assert why is not None  # the same test as over_budget's second
        rate = live_rate_micros
        for lease_id, lease_rate in reversed(running):
            if rate <= caps.usd_per_hour_micros:
                break
            out[lease_id] = why
            rate -= lease_rate
    return out
