"""Leader election through the store itself, so several replicas can serve quotes while exactly
one runs the reconciler and the autoscaler.

PostgreSQL: a session-level advisory lock held on a dedicated connection; if that connection
drops, the lock (and leadership) goes with it and another replica takes over. SQLite is a
single-host embedded store: the one process that owns it leads.
"""
from __future__ import annotations

import threading

import structlog
from sqlalchemy import text

log = structlog.get_logger("broker.leader")

LEADER_LOCK = 0x62726F6C  # "brol"


class Leadership:
    def __init__(self, store) -> None:
        self.store = store
        self._conn = None
        self._lock = threading.Lock()
        self._leading = not store.is_postgres

    def is_leader(self) -> bool:
        if not self.store.is_postgres:
            return True
        with self._lock:
            try:
                if self._conn is None:
                    self._conn = self.store.engine.connect()
                if not self._leading:
                    got = self._conn.execute(text("SELECT pg_try_advisory_lock(:k)").bindparams(k=LEADER_LOCK)).scalar()
                    self._conn.commit()
                    if got:
                        self._leading = True
                        log.info("leadership_acquired")
                else:
                    self._conn.execute(text("SELECT 1"))  # still connected = still holding the lock
                    self._conn.commit()
            except Exception as e:  # lost the connection: lost the lock
                if self._leading:
                    log.warning("leadership_lost", error=str(e).splitlines()[0])
                self._leading = False
                self._drop()
            return self._leading

    def _drop(self) -> None:
        if self._conn is not None:
            try:
                # Invalidate, not just close: a pooled connection would keep holding the lock.
                self._conn.invalidate()
                self._conn.close()
            except Exception:
                pass
            self._conn = None

    def release(self) -> None:
        with self._lock:
            self._leading = not self.store.is_postgres
            self._drop()
