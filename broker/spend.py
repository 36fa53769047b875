"""What a tenant's budget counts this month, read at a cost that does not grow with its history.

A budget check (every Launch and capacity-block purchase of a tenant with caps, each reconciler
pass, each /metrics scrape) needs the tenant's live rate and its spend since the month began. The
leases that ended this month after starting in it are most of a busy tenant's leases, and each
of those spent exactly its ``accrued_micros``: the database sums them (one row back, walking
``ix_leases_tenant_state_ended_at`` from the month's start). Only the leases whose spend needs
the clock or a proration are read as rows: the live ones, and the ended ones that started before
the month (at most those live at its start). The totals are those of
:func:`broker.budget.lease_spend_since` over every counted lease.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select

from broker.lease import ENDED, LIVE

#: The columns the budget computes spend and rates from (plain rows, never a full lease).
SPEND_COLUMNS = ("lease_id", "state", "created_at", "started_at", "ended_at", "accrued_at", "accrued_micros",
                 "hourly_micros", "nodes", "job_state")


@dataclass(frozen=True)
class Counted:
    """A tenant's leases that count against its caps from ``since``: ``rows`` (the
    :data:`SPEND_COLUMNS` of its live leases and of the ended ones whose spend is prorated) and
    ``settled_micros``, the summed spend of the ended leases that started at or after ``since``."""

    rows: list[Any]
    settled_micros: int


def counted(conn, leases, tenant: str, since: float) -> Counted:
    """Read :class:`Counted` for ``tenant`` on ``conn`` (``leases``: the leases table)."""
    t = leases.c
    ended = [s.value for s in ENDED]
    cols = [t[c] for c in SPEND_COLUMNS]
    # A lease's spend starts at started_at, or at accrued_at when it never ran (a block bought
    # up front); with neither it spent nothing.
    started_in = (t.started_at >= since) | ((t.started_at == 0) & (t.accrued_at >= since))
    started_before = (((t.started_at > 0) & (t.started_at < since))
                      | ((t.started_at == 0) & (t.accrued_at > 0) & (t.accrued_at < since)))
    live = conn.execute(select(*cols).where(t.tenant == tenant, t.state.in_([s.value for s in LIVE]))).all()
    prorated = conn.execute(select(*cols).where(
        t.tenant == tenant, t.state.in_(ended),
        (t.ended_at == 0) | ((t.ended_at > since) & started_before))).all()
    settled = conn.execute(select(func.sum(t.accrued_micros)).where(
        t.tenant == tenant, t.state.in_(ended), t.ended_at > since, started_in)).scalar()
    # SUM over bigint is a Decimal on PostgreSQL, an int on SQLite, NULL over no rows
    return Counted([*live, *prorated], int(settled or 0))
