"""The live market in the store: one dated snapshot per provider, shared by every replica.

A row holds the last good :class:`providers.market.Snapshot` of a provider (``fetched_at``), when
a refresh was last tried (``attempted_at``) and what went wrong then (``last_error``, "" when
nothing did). A failed refresh only updates ``attempted_at`` and ``last_error``: the data a quote
uses stays the last good one. Also read from here: the interruptions this broker observed on
spot leases, and the reservation nodes live leases hold.

Writes go through the store's SQLAlchemy engine (SQLite or PostgreSQL) into its own table
(``market_snapshots``, created by the store's migrations). Reads take that engine or, for an in-process `broker quote` on the
embedded SQLite store, a plain ``sqlite3`` connection (:func:`reader`): the same SQL, without
paying SQLAlchemy's import on every command.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from providers.market import SOURCES, Snapshot, SourceState

class MarketRow:
    __slots__ = ("snapshot", "attempted_at", "last_error")

    def __init__(self, snapshot: Snapshot, attempted_at: float, last_error: str) -> None:
        self.snapshot, self.attempted_at, self.last_error = snapshot, attempted_at, last_error

    def sources(self) -> dict[str, SourceState]:
        """Each source's state as of the last attempt: a refresh that failed as a whole (nothing
        stored from it) leaves every source failing with its error, and its last good age."""
        states = dict(self.snapshot.sources)
        if self.last_error and self.attempted_at > self.snapshot.fetched_at:
            names = states or dict.fromkeys(SOURCES, SourceState(self.snapshot.fetched_at))
            states = {k: SourceState(v.ok_at, self.last_error) for k, v in names.items()}
        return states


def _rows(db: Any, sql: str, params: dict | None = None) -> list[tuple] | None:
    """Rows of a read on an SQLAlchemy engine or a sqlite3 connection; None when the table or
    the database is not there (never refreshed)."""
    import sqlite3  # here and below: a quote with no store yet never needs them

    if isinstance(db, sqlite3.Connection):
        try:
            return db.execute(sql, params or {}).fetchall()
        except sqlite3.Error:
            return None
    from sqlalchemy import text
    from sqlalchemy.exc import SQLAlchemyError

    try:
        with db.connect() as conn:
            return [tuple(r) for r in conn.execute(text(sql), params or {}).all()]
    except SQLAlchemyError:
        return None


def _write(engine: Any, *statements: tuple[str, dict]) -> list[int]:
    from sqlalchemy import text

    with engine.begin() as conn:
        return [conn.execute(text(sql), params).rowcount for sql, params in statements]


def reader(db_url: str, connect_timeout_s: float = 10.0) -> Any:
    """Something to read the market from ``db_url`` without creating anything: a read-only
    sqlite3 connection for an embedded store (None when it does not exist yet), else an engine."""
    if db_url.startswith("sqlite:///"):
        path = db_url[len("sqlite:///"):]
        if not path or path == ":memory:" or not Path(path).exists():
            return None
        import sqlite3

        return sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)
    from sqlalchemy import create_engine

    from broker.engine import pg_connect_args

    return create_engine(db_url, connect_args=pg_connect_args(connect_timeout_s))


def load(db: Any) -> dict[str, MarketRow]:
    """Every provider's stored market ({} when none was ever refreshed)."""
    rows = _rows(db, "SELECT provider, attempted_at, last_error, body FROM market_snapshots") or []
    return {p: MarketRow(Snapshot.from_json(body), attempted, error or "")
            for p, attempted, error, body in rows}


def version(db: Any) -> float:
    """Changes whenever any provider's market is written (for replicas polling for news)."""
    rows = _rows(db, "SELECT MAX(attempted_at) FROM market_snapshots")
    return float(rows[0][0] or 0.0) if rows else 0.0


def save(engine: Any, snap: Snapshot, attempted_at: float, error: str = "") -> None:
    """Store ``snap`` as ``snap.provider``'s current market."""
    import json

    _write(engine, ("DELETE FROM market_snapshots WHERE provider = :p", {"p": snap.provider}),
           ("INSERT INTO market_snapshots (provider, fetched_at, attempted_at, last_error, body) "
            "VALUES (:p, :f, :a, :e, :b)", {"p": snap.provider, "f": snap.fetched_at, "a": attempted_at,
                                           "e": error, "b": json.dumps(snap.to_dict())}))


def record_failure(engine: Any, provider: str, attempted_at: float, error: str) -> None:
    """A refresh of ``provider`` failed: say so, keep the last good data."""
    (n,) = _write(engine, ("UPDATE market_snapshots SET attempted_at = :a, last_error = :e WHERE provider = :p",
                           {"a": attempted_at, "e": error, "p": provider}))
    if not n:
        save(engine, Snapshot(provider, 0.0), attempted_at, error)


def observed_spot(db: Any, now: float) -> dict[tuple[str, str, str], tuple[int, float]]:
    """(provider, region, instance type) -> (interruptions, node-hours) of this broker's spot leases."""
    rows = _rows(db, "SELECT l.provider, l.region, l.instance_type, l.nodes, l.started_at, l.ended_at, "
                     "(SELECT COUNT(*) FROM lease_events e WHERE e.lease_id = l.lease_id AND e.kind = 'interrupted') "
                     "FROM leases l WHERE l.market = 'spot' AND l.started_at > 0") or []
    out: dict[tuple[str, str, str], list[float]] = {}
    for provider, region, itype, nodes, started, ended, interrupted in rows:
        acc = out.setdefault((provider, region, itype), [0, 0.0])
        acc[0] += int(interrupted)
        acc[1] += max(0.0, ((ended or now) - started) / 3600.0) * nodes
    return {k: (int(v[0]), v[1]) for k, v in out.items()}


def spot_lives(db: Any, now: float) -> dict[str, list[tuple[float, bool]]]:
    """Provider -> (seconds, censored) per node of this broker's spot leases that ran: how long
    each lived before it was interrupted, or has lived so far (censored) when it was not."""
    rows = _rows(db, "SELECT l.provider, l.nodes, l.started_at, l.ended_at, "
                     "(SELECT COUNT(*) FROM lease_events e WHERE e.lease_id = l.lease_id AND e.kind = 'interrupted') "
                     "FROM leases l WHERE l.market = 'spot' AND l.started_at > 0") or []
    out: dict[str, list[tuple[float, bool]]] = {}
    for provider, nodes, started, ended, interrupted in rows:
        life = (ended or now) - started
        if life > 0:
            out.setdefault(provider, []).extend([(life, not interrupted)] * max(1, min(int(nodes), 64)))
    return out


def held(db: Any, since: dict[str, float]) -> dict[str, int]:
    """Nodes each reservation in ``since`` has in live leases created at or after its time
    (earlier ones are already in the cloud's own count of what the reservation runs)."""
    if not since:
        return {}
    from broker.lease import LIVE  # the lease module's import only where a store holds leases

    names = sorted(since)
    marks = ", ".join(f":r{i}" for i in range(len(names)))
    states = ", ".join(f"'{s.value}'" for s in sorted(LIVE))
    rows = _rows(db, f"SELECT reservation, nodes, created_at FROM leases WHERE state IN ({states}) "
                     f"AND reservation IN ({marks})", {f"r{i}": n for i, n in enumerate(names)}) or []
    out: dict[str, int] = {}
    for reservation, nodes, created_at in rows:
        if created_at >= since.get(reservation, 0.0):
            out[reservation] = out.get(reservation, 0) + int(nodes)
    return out
