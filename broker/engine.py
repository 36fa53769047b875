"""The store's SQLAlchemy engine: SQLite in WAL mode, or a pooled PostgreSQL engine.

The pool keeps as many connections open as the process's threads that use the store at once
(``[store] pool_size``; by default ``[server] workers`` plus :data:`BACKGROUND_THREADS`): a pool
smaller than that opens an overflow connection for each call past it and closes it again when the
call returns, which under steady load is a new PostgreSQL server process every few seconds.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event

from broker.sqlite_gate import GatedConnection

#: Threads beside the RPC workers that use the store: the leader's loop, the reconciler, the
#: autoscaler, the quote writer, the market refresh, /metrics, the callback endpoint and a launch's
#: own provisioning thread.
BACKGROUND_THREADS = 8
#: Connections a pool may open past its size for a burst (closed again when returned).
MAX_OVERFLOW = 8
#: Connections opened at start-up (Store.open_connections); the pool grows past them under load.
WARM_CONNECTIONS = 10
#: The pool of a store opened without a size (a command, a test): as before sizes were settings.
DEFAULT_POOL = (10, 20)


def pool_size_for(workers: int, configured: int = 0) -> int:
    """``[store] pool_size``, or (0) one connection per RPC worker and background thread."""
    return configured or workers + BACKGROUND_THREADS


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=10000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def engine_for(url: str, *, create: bool = True, connect_timeout_s: float = 10.0,
               pool_size: int | None = None, max_overflow: int = MAX_OVERFLOW):
    """The store's engine for ``url``: SQLite in WAL mode (its directory made unless ``create``
    is false), or a pooled engine for PostgreSQL whose connections give up after
    ``connect_timeout_s`` (``[store] connect_timeout_s``). With ``pool_size``, either keeps that many
    connections open and opens at most ``max_overflow`` more for a burst; without it, PostgreSQL
    keeps :data:`DEFAULT_POOL` and SQLite SQLAlchemy's default. Raises SQLAlchemy's ArgumentError or
    NoSuchModuleError on a URL it cannot use."""
    if url.startswith("sqlite"):
        path = url.split("///", 1)[1] if "///" in url else ""
        pooled: dict[str, Any] = {}
        if create and path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        if pool_size is not None and path and path != ":memory:":  # a file: a queue pool
            pooled = {"pool_size": pool_size, "max_overflow": max_overflow}
        # GatedConnection: this process's writers of a database file take turns (broker.sqlite_gate;
        # an in-memory database has no gate)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 10,
                                                  "factory": GatedConnection}, **pooled)
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    size, overflow = DEFAULT_POOL if pool_size is None else (pool_size, max_overflow)
    return create_engine(url, pool_pre_ping=True, pool_size=size, max_overflow=overflow,
                         connect_args=pg_connect_args(connect_timeout_s))


def pg_connect_args(connect_timeout_s: float) -> dict[str, Any]:
    """libpq's connect_timeout: whole seconds, and it treats less than 2 as 2."""
    return {"connect_timeout": max(2, math.ceil(connect_timeout_s))}
