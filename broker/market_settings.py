"""``[catalog]`` and ``[market]``: the settings of the price catalog and of the live market laid
over it (:mod:`broker.market`), part of the configuration's schema (:mod:`broker.config`). Apart
from :mod:`broker.market` so that a quote, which reads them already checked, never loads the schema.
"""
from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from providers.settings import NUMBER_LIMIT, Table, bad

NonNegative = Annotated[float, Meta(ge=0, le=NUMBER_LIMIT)]


class CatalogSettings(Table):
    """``[catalog]``: the price catalog and the live market laid over it (:mod:`broker.market`)."""

    path: str = ""  # directory of instances.csv, prices.csv, regions.csv ("" = the bundled one)
    refresh_interval_s: NonNegative = 4 * 3600.0  # background market refresh (0 = off)
    max_age_h: NonNegative = 48.0  # a live price older than this is stale in quotes (0 = never)

    def __post_init__(self) -> None:
        if self.path:  # said before the server listens; what the files hold is read when it starts
            import os

            missing = [f for f in ("instances.csv", "prices.csv", "regions.csv", "network.toml")
                       if not os.path.exists(os.path.join(self.path, f))]
            if missing:
                raise bad("path", f"{self.path[:200]} is not a catalog directory: it holds no {missing[0]}")


class MarketSettings(Table):
    """``[market]``: what spot offers are judged by (:mod:`policies.spot_choice`)."""

    # Observed spot lifetimes: a CSV of cloud, observed_lifetime_s, ended_by (the shape of
    # spot_instance_lifetimes_aws_gcp_2020.csv). "" = none: the interruptions this broker's own
    # spot leases met are still used, else the catalog's interruption rates.
    spot_lifetimes: str = ""
    # A spot offer is quoted only if the job finishes on it by its deadline with this confidence.
    spot_confidence: Annotated[float, Meta(gt=0.0, lt=1.0)] = 0.9
    # The deadline of a demand that names none: start-up + runtime x (1 + this).
    spot_deadline_slack: Annotated[float, Meta(ge=0.0, le=100.0)] = 1.0
    # Buy AWS Capacity Blocks for ML (paid up front, not refundable). Off: they are quoted with their
    # start and fee but excluded from launch; on: a launch of one buys it when the tenant's month
    # budget covers its whole fee, and the lease waits for its start (broker.blocks).
    buy_capacity_blocks: bool = False
