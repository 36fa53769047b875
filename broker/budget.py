"""Budgets in the service: caps from config, spend from the store, decisions from policies.budget."""
from __future__ import annotations

import datetime as dt
from typing import Mapping

from broker.config import Budget
from broker.jobs import running
from broker.lease import LIVE, EventKind, Lease, LeaseState, cost_so_far
from broker.spend import Counted
from broker.store import Store
from policies.budget import Caps, launch_refusal, purchase_refusal, to_release
from providers.base import MICROS
from broker.errors import OverBudget

#: A tenant is warned as its spend crosses these fractions of a cap (events and a metric).
WARN_AT = (0.8, 1.0)


def month_start(now: float) -> float:
    d = dt.datetime.fromtimestamp(now, dt.timezone.utc)
    return dt.datetime(d.year, d.month, 1, tzinfo=dt.timezone.utc).timestamp()


def lease_spend_since(lease: Lease, since: float, now: float) -> int:
    """Micro-dollars a lease accrued after ``since`` (prorated when it started earlier)."""
    start = lease.started_at or lease.accrued_at
    if not start:
        return 0
    end = lease.ended_at or now
    if end <= since:
        return 0
    total = cost_so_far(lease, now)
    if start >= since:
        return total
    span = max(1e-9, end - start)
    return int(total * (end - since) / span)


class Budgets:
    def __init__(self, store: Store, budgets: Mapping[str, Budget], on_exhausted: str = "finish_running") -> None:
        self.store = store
        self.budgets = dict(budgets)
        self.on_exhausted = on_exhausted  # [budgets] on_exhausted
        self._warned: set[tuple[str, str, float, float]] = set()  # (tenant, cap, level, period)

    def caps(self, tenant: str) -> Caps | None:
        b = self.budgets.get(tenant) or self.budgets.get("default")
        if b is None:
            return None
        to = lambda v: None if v is None else int(v * MICROS)  # noqa: E731
        return Caps(to(b.usd_per_hour), to(b.usd_per_month))

    def _counted(self, tenant: str, now: float) -> Counted:
        """What counts against the tenant's caps now (broker.spend): its live leases and the ones
        ended this month that started before it, as plain rows, and the summed spend of the rest."""
        return self.store.counted(tenant, month_start(now))

    def usage(self, tenant: str, now: float, counted: Counted | None = None) -> tuple[int, int]:
        """(live rate micros/h, month spend micros) for ``tenant``."""
        since = month_start(now)
        c = self._counted(tenant, now) if counted is None else counted
        rate, spend = 0, c.settled_micros
        for l in c.rows:
            if l.state in LIVE:
                rate += l.hourly_micros * l.nodes
            if (l.ended_at or now) >= since:
                spend += lease_spend_since(l, since, now)
        return rate, spend

    def check_launch(self, tenant: str, new_rate_micros: int, now: float,
                     counted: Counted | None = None) -> None:
        """Refuse (OverBudget) a launch at ``new_rate_micros`` that breaks a cap.
        ``counted``: what counts against the tenant's caps as read inside the insert's
        transaction (see :meth:`admission`); None reads it now."""
        caps = self.caps(tenant)
        if caps is None:
            return
        rate, spend = self.usage(tenant, now, counted)
        why = launch_refusal(tenant, caps, rate, spend, new_rate_micros)
        if why:
            raise OverBudget(why + ".")

    def admission(self, tenant: str, new_rate_micros: int, now: float):
        """``(admit, counted_since)`` for :meth:`broker.store.Store.create_lease`, which runs the
        check and the insert as one atomic step; ``(None, 0.0)`` for a tenant without caps."""
        if self.caps(tenant) is None:
            return None, 0.0
        return (lambda counted: self.check_launch(tenant, new_rate_micros, now, counted)), month_start(now)

    def purchase_admission(self, tenant: str, fee_micros: int, now: float):
        """``(admit, counted_since)`` for :meth:`broker.store.Store.charge_lease`: the check that the
        month's budget covers ``fee_micros`` paid up front, run with the write that records it;
        ``(None, 0.0)`` for a tenant without caps."""
        caps = self.caps(tenant)
        if caps is None:
            return None, 0.0

        def admit(counted: Counted) -> None:
            _, spend = self.usage(tenant, now, counted)
            why = purchase_refusal(tenant, caps, spend, fee_micros)
            if why:
                raise OverBudget(why + ".")
        return admit, month_start(now)

    def releases(self, tenant: str, now: float) -> dict[str, str]:
        """Running leases of ``tenant`` the reconciler must release for budget, with why."""
        caps = self.caps(tenant)
        if caps is None:
            return {}
        counted = self._counted(tenant, now)
        rate, spend = self.usage(tenant, now, counted)
        self._warn(tenant, caps, rate, spend, now)
        # A running job finishes (the default) unless the operator asked for checkpoint_and_stop;
        # the reconciler requeues the jobs of the leases it releases (never a silent kill).
        keep = (lambda l: running(l)) if self.on_exhausted == "finish_running" else (lambda l: False)
        candidates = sorted((l for l in counted.rows if l.state == LeaseState.RUNNING and not keep(l)),
                            key=lambda l: (l.created_at, l.lease_id))
        return to_release(tenant, caps, [(l.lease_id, l.hourly_micros * l.nodes) for l in candidates], rate, spend)

    def _warn(self, tenant: str, caps: Caps, rate: int, spend: int, now: float) -> None:
        """A ``budget_warning`` event the first time a cap's use crosses 80 % and 100 % (per month
        for usd_per_month; again after the rate fell back below for usd_per_hour)."""
        for cap, used, limit, period in (("usd_per_hour", rate, caps.usd_per_hour_micros, 0.0),
                                         ("usd_per_month", spend, caps.usd_per_month_micros, month_start(now))):
            if not limit:
                continue
            fraction = used / limit
            for level in WARN_AT:
                key = (tenant, cap, level, period)
                if fraction < level:
                    self._warned.discard(key)
                    continue
                if key in self._warned:
                    continue
                self._warned.add(key)
                self.store.add_event("", EventKind.BUDGET_WARNING, f"tenant {tenant} has used {fraction:.0%} of "
                                     f"{cap} = {limit / MICROS:g}; at 100 % new spend is refused and running "
                                     f"jobs {self.on_exhausted.replace('_', ' ')}", now,
                                     data={"tenant": tenant, "cap": cap, "level": level, "used": round(fraction, 4)})

