"""GCP flex-start (Dynamic Workload Scheduler) as queued capacity.

A flex-start VM is created with ``scheduling.provisioningModel = FLEX_START``, a
``maxRunDuration`` of at most seven days and ``instanceTerminationAction = DELETE``; Compute Engine
starts it when capacity frees and deletes it at the end of the run. Google names no start time
ahead, so a quote takes the configured expected wait (``[providers.gcp] flex_start_wait_h``) as
the offer's start, and the run it allows as ``flex_start_max_run_h``. The price is the offering's
on-demand list price: flex-start is billed per second as it runs (Google sells it at a discount
the bundled catalog does not carry, so the quote errs high).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterable

from providers.base import Market, Offering

# Machine families flex-start serves (accelerator-optimized); N1 shapes with attached GPUs are not.
FLEX_START_FAMILIES = ("a2-", "a3-", "a4-", "g2-")
MAX_RUN_S = 7 * 24 * 3600  # the longest maxRunDuration Compute Engine accepts for flex-start


def flex_start_offerings(offerings: Iterable[Offering], settings: Any) -> list[Offering]:
    """One queued offering per GCP on-demand offering of a flex-start family in ``settings``'
    regions, starting ``flex_start_wait_h`` after the quote's time."""
    regions = set(settings.regions)
    out = []
    for o in offerings:
        if (o.provider != "gcp" or o.market is not Market.ON_DEMAND or o.region not in regions
                or not o.instance.sdk_machine_type.startswith(FLEX_START_FAMILIES)):
            continue
        out.append(dataclasses.replace(
            o, market=Market.QUEUED, wait_s=settings.flex_start_wait_h * 3600.0,
            max_run_h=settings.flex_start_max_run_h, source="gcp:flex_start",
            price_source=o.price_source or f"bundled:{o.as_of}"))
    return out


def flex_start_scheduling(max_run_h: float) -> dict[str, Any]:
    """The ``scheduling`` of an instances.insert body for a flex-start VM running ``max_run_h``
    hours at most (rounded up to whole seconds, capped at seven days)."""
    seconds = min(MAX_RUN_S, max(1, int(-(-max_run_h * 3600.0 // 1))))
    return {"provisioningModel": "FLEX_START", "maxRunDuration": {"seconds": seconds},
            "instanceTerminationAction": "DELETE", "onHostMaintenance": "TERMINATE",
            "automaticRestart": False}
