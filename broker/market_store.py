"""The live market in the store: one dated snapshot per provider, shared by every replica.

A row holds the last good :class:`providers.market.Snapshot` of a provider (``fetched_at``), when
a refresh was last tried (``attempted_at``) and what went wrong then (``last_error``, "" when
nothing did). A failed refresh only updates ``attempted_at`` and ``last_error``: the data a quote
uses stays the last good one. Also read from here: the interruptions this broker observed on
spot leases, and the reservation nodes live leases hold.

It uses the store's engine (SQLite or PostgreSQL) and its own table, created on first use.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sqlalchemy import Column, Float, MetaData, String, Table, Text, create_engine, delete, insert, select, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from providers.market import Snapshot

LIVE_STATES = ("requested", "provisioning", "running", "draining")

_meta = MetaData()
market_snapshots = Table(
    "market_snapshots", _meta,
    Column("provider", String(16), primary_key=True),
    Column("fetched_at", Float, nullable=False),
    Column("attempted_at", Float, nullable=False),
    Column("last_error", Text, nullable=False, default=""),
    Column("body", Text, nullable=False),
)


class MarketRow:
    __slots__ = ("snapshot", "attempted_at", "last_error")

    def __init__(self, snapshot: Snapshot, attempted_at: float, last_error: str) -> None:
        self.snapshot, self.attempted_at, self.last_error = snapshot, attempted_at, last_error


def ensure(engine: Engine) -> None:
    _meta.create_all(engine, checkfirst=True)


def reader(db_url: str) -> Engine | None:
    """An engine to read the market from ``db_url`` without creating anything (None when an
    embedded SQLite store does not exist yet)."""
    if db_url.startswith("sqlite:///"):
        path = db_url[len("sqlite:///"):]
        if path and path != ":memory:" and not Path(path).exists():
            return None
    return create_engine(db_url)


def load(engine: Engine) -> dict[str, MarketRow]:
    """Every provider's stored market ({} when none was ever refreshed)."""
    try:
        with engine.connect() as conn:
            rows = conn.execute(select(market_snapshots)).all()
    except SQLAlchemyError:
        return {}  # no table yet: never refreshed
    return {r.provider: MarketRow(Snapshot.from_dict(json.loads(r.body)), r.attempted_at, r.last_error)
            for r in rows}


def version(engine: Engine) -> float:
    """Changes whenever any provider's market is written (for replicas polling for news)."""
    try:
        with engine.connect() as conn:
            v = conn.execute(text("SELECT MAX(attempted_at) FROM market_snapshots")).scalar()
    except SQLAlchemyError:
        return 0.0
    return float(v or 0.0)


def save(engine: Engine, snap: Snapshot, attempted_at: float, error: str = "") -> None:
    """Store ``snap`` as ``snap.provider``'s current market."""
    ensure(engine)
    with engine.begin() as conn:
        conn.execute(delete(market_snapshots).where(market_snapshots.c.provider == snap.provider))
        conn.execute(insert(market_snapshots).values(
            provider=snap.provider, fetched_at=snap.fetched_at, attempted_at=attempted_at,
            last_error=error, body=json.dumps(snap.to_dict())))


def record_failure(engine: Engine, provider: str, attempted_at: float, error: str) -> None:
    """A refresh of ``provider`` failed: say so, keep the last good data."""
    ensure(engine)
    with engine.begin() as conn:
        n = conn.execute(market_snapshots.update().where(market_snapshots.c.provider == provider)
                         .values(attempted_at=attempted_at, last_error=error)).rowcount
        if not n:
            conn.execute(insert(market_snapshots).values(
                provider=provider, fetched_at=0.0, attempted_at=attempted_at, last_error=error,
                body=json.dumps(Snapshot(provider, 0.0).to_dict())))


def observed_spot(engine: Engine, now: float) -> dict[tuple[str, str, str], tuple[int, float]]:
    """(provider, region, instance type) -> (interruptions, node-hours) of this broker's spot leases."""
    q = text("SELECT l.provider, l.region, l.instance_type, l.nodes, l.started_at, l.ended_at, "
             "(SELECT COUNT(*) FROM lease_events e WHERE e.lease_id = l.lease_id AND e.kind = 'interrupted') "
             "FROM leases l WHERE l.market = 'spot' AND l.started_at > 0")
    out: dict[tuple[str, str, str], list[float]] = {}
    try:
        with engine.connect() as conn:
            rows = conn.execute(q).all()
    except SQLAlchemyError:
        return {}
    for provider, region, itype, nodes, started, ended, interrupted in rows:
        hours = max(0.0, ((ended or now) - started) / 3600.0) * nodes
        acc = out.setdefault((provider, region, itype), [0, 0.0])
        acc[0] += int(interrupted)
        acc[1] += hours
    return {k: (int(v[0]), v[1]) for k, v in out.items()}


def held(engine: Engine, since: dict[str, float]) -> dict[str, int]:
    """Nodes each reservation in ``since`` has in live leases created at or after its time
    (earlier ones are already in the cloud's own count of what the reservation runs)."""
    if not since:
        return {}
    names = sorted(since)
    q = select(text("reservation, nodes, created_at")).select_from(text("leases")).where(
        text("state IN ('requested', 'provisioning', 'running', 'draining')")).where(
        text("reservation IN (" + ", ".join(f":r{i}" for i in range(len(names))) + ")"))
    try:
        with engine.connect() as conn:
            rows = conn.execute(q, {f"r{i}": n for i, n in enumerate(names)}).all()
    except SQLAlchemyError:
        return {}
    out: dict[str, int] = {}
    for reservation, nodes, created_at in rows:
        if created_at >= since.get(reservation, 0.0):
            out[reservation] = out.get(reservation, 0) + int(nodes)
    return out


def as_json(rows: dict[str, MarketRow]) -> dict[str, Any]:
    return {p: {"fetched_at": r.snapshot.fetched_at, "attempted_at": r.attempted_at, "last_error": r.last_error}
            for p, r in rows.items()}
