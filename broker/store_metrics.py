"""What /metrics reads from the store, at a cost that does not grow with the store's history.

The lease gauges (leases by state, the running leases' price, the live leases' GPUs) read the live
leases only (``ix_leases_state_ended_at``). The totals over history (the ended leases by state,
provider and market; spend by provider; lease events by kind; decisions by action) are sums of
rows that do not change once written: each scrape reads the rows of the last hour by their time
(an index range) and adds the totals of the older rows, which a process counts once, at its first
scrape, and then extends only by the rows that have passed the hour since.

"The last hour" is measured from the newest lease event's time (the store's own clock, whichever
replica wrote it), never the scraping process's. A row written with a time more than
:data:`SETTLE_S` behind an event already in the store (a writer whose clock is an hour behind
the others', or a transaction open for an hour) is missed by a process that had counted past it,
until it restarts.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from sqlalchemy import func, select
from sqlmodel import SQLModel

import broker.store  # noqa: F401  (declares the tables read here: leases, lease_events, decisions)
from broker.lease import ENDED, LIVE

#: Rows younger than this (behind the newest lease event) are read at each scrape.
SETTLE_S = 3600.0

Totals = dict[tuple, list[int]]


def _totals(rows, sums: int) -> Totals:
    """Grouped rows (the key's columns, then ``sums`` sums) as Totals. SUM over bigint is an int
    on SQLite and a Decimal on PostgreSQL: both become ints."""
    return {tuple(r[:-sums]): [int(x or 0) for x in r[-sums:]] for r in rows}


def _merge(into: Totals, more: Totals) -> Totals:
    for key, sums in more.items():
        have = into.setdefault(key, [0] * len(sums))
        for i, x in enumerate(sums):
            have[i] += x
    return into


def _between(q, column, lo: float | None, hi: float | None):
    if lo is not None:
        q = q.where(column >= lo)
    if hi is not None:
        q = q.where(column < hi)
    return q


class _Settled:
    """Totals over rows by a time column: the rows before ``upto`` counted once and kept, the rest
    counted at each read. ``count(conn, lo, hi)`` sums the rows with ``lo <= time < hi``."""

    def __init__(self, count: Callable[[Any, float | None, float | None], Totals]) -> None:
        self.count = count
        self.upto: float | None = None
        self.totals: Totals = {}

    def read(self, conn, horizon: float | None) -> Totals:
        if horizon is None:  # nothing written yet: no history to keep
            return self.count(conn, None, None)
        if self.upto is None:
            self.totals, self.upto = self.count(conn, None, horizon), horizon
        elif horizon > self.upto:
            _merge(self.totals, self.count(conn, self.upto, horizon))
            self.upto = horizon
        return _merge({k: list(v) for k, v in self.totals.items()}, self.count(conn, self.upto, None))


@dataclass
class StoreTotals:
    """One scrape's figures: ``live`` rows of (state, provider, market, instance type, leases,
    nodes, hourly micros × nodes, accrued micros); ``ended`` {(state, provider, market): [leases,
    accrued micros]}; ``events`` {(kind,): [n]}; ``decisions`` {(action,): [n]}."""

    live: list[Any] = field(default_factory=list)
    ended: Totals = field(default_factory=dict)
    events: Totals = field(default_factory=dict)
    decisions: Totals = field(default_factory=dict)


class StoreReader:
    """Reads :class:`StoreTotals`, keeping the settled history's totals between scrapes."""

    def __init__(self, engine) -> None:
        self.engine = engine
        tables = SQLModel.metadata.tables
        self._leases = tables["leases"].c
        self._events = tables["lease_events"].c
        self._decisions = tables["decisions"].c
        self._lock = threading.Lock()  # scrapes may overlap
        self._ended = _Settled(self._count_ended)
        self._by_kind = _Settled(self._count_events)
        self._by_action = _Settled(self._count_decisions)

    def read(self) -> StoreTotals:
        t = self._leases
        with self._lock, self.engine.connect() as conn:
            # One snapshot, so a lease that ends meanwhile counts once: REPEATABLE READ on
            # PostgreSQL; on SQLite one deferred transaction, which reads the database as it was
            # at its first SELECT (the driver starts none for a SELECT of its own).
            if conn.dialect.name == "postgresql":
                conn = conn.execution_options(isolation_level="REPEATABLE READ")
            else:
                conn.exec_driver_sql("BEGIN")
            live = list(conn.execute(
                select(t.state, t.provider, t.market, t.instance_type, func.count(), func.sum(t.nodes),
                       func.sum(t.hourly_micros * t.nodes), func.sum(t.accrued_micros))
                .where(t.state.in_([s.value for s in LIVE]))
                .group_by(t.state, t.provider, t.market, t.instance_type)))
            newest = conn.execute(select(func.max(self._events.at))).scalar()
            horizon = None if newest is None else float(newest) - SETTLE_S
            return StoreTotals(live, self._ended.read(conn, horizon), self._by_kind.read(conn, horizon),
                               self._by_action.read(conn, horizon))

    def _count_ended(self, conn, lo: float | None, hi: float | None) -> Totals:
        t = self._leases
        q = select(t.state, t.provider, t.market, func.count(), func.sum(t.accrued_micros)) \
            .where(t.state.in_([s.value for s in ENDED]))
        return _totals(conn.execute(_between(q, t.ended_at, lo, hi).group_by(t.state, t.provider, t.market)), 2)

    def _count_events(self, conn, lo: float | None, hi: float | None) -> Totals:
        e = self._events
        return _totals(conn.execute(_between(select(e.kind, func.count()), e.at, lo, hi).group_by(e.kind)), 1)

    def _count_decisions(self, conn, lo: float | None, hi: float | None) -> Totals:
        d = self._decisions
        return _totals(conn.execute(_between(select(d.action, func.count()), d.at, lo, hi).group_by(d.action)), 1)
