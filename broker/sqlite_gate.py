"""One writer at a time per SQLite database in this process, woken in turn instead of polling.

SQLite lets one connection write at a time. A connection that finds the write lock taken waits
in SQLite's busy handler, which sleeps and retries (1, 2, 5 … 100 ms apart): under load, writers
that could have gone a millisecond after the lock was freed sleep tens of milliseconds, and a
Quote waiting for its quote to be committed waits behind them all. Measured with py-spy on a
loaded `broker serve` on SQLite (the soak in `benchmarks/load.py`): ~4 threads at any moment
waited in that handler, and 99 % of a Quote's time was the wait for its commit.

:class:`GatedConnection` (the ``factory`` of every connection the store opens to a database file)
takes a lock per database file before the statement that starts a write (what SQLite takes its
write lock for: the first INSERT, UPDATE, DELETE, REPLACE or DDL of a transaction, or
``BEGIN IMMEDIATE``) and gives it back once the transaction ends (commit, rollback, close, or a
statement that ended it). Writers of this process then queue on a lock that hands over at once;
SQLite's own lock and busy handler still order them against other processes. A writer that cannot
take the gate within the connection's ``timeout`` fails as SQLite would ("database is locked").
"""
from __future__ import annotations

import os
import sqlite3
import threading

_WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE", "CREATE", "DROP", "ALTER")
_WRITE_BEGINS = ("BEGIN IMMEDIATE", "BEGIN EXCLUSIVE")

_gates: dict[str, threading.Lock] = {}
_gates_lock = threading.Lock()


def gate_for(database: str) -> threading.Lock | None:
    """The lock of the database file ``database`` (None for an in-memory database: each
    connection to one is a database of its own)."""
    if not database or database == ":memory:" or database.startswith("file::memory:"):
        return None
    key = os.path.realpath(database)
    with _gates_lock:
        return _gates.setdefault(key, threading.Lock())


def starts_write(sql: str) -> bool:
    """Whether ``sql`` is a statement SQLite takes its write lock for."""
    head = sql.lstrip()[:15].upper()
    return head.startswith(_WRITES) or head.startswith(_WRITE_BEGINS)


class GatedCursor(sqlite3.Cursor):
    connection: "GatedConnection"

    def execute(self, sql, parameters=(), /):  # type: ignore[override]
        return self._through_gate(super().execute, sql, parameters)

    def executemany(self, sql, seq_of_parameters, /):  # type: ignore[override]
        return self._through_gate(super().executemany, sql, seq_of_parameters)

    def _through_gate(self, run, sql, arg):
        """``run(sql, arg)``, having taken the gate first if ``sql`` starts a write."""
        conn = self.connection
        if conn.gate is not None and not conn.holding and starts_write(sql):
            conn.enter()
        try:
            return run(sql, arg)
        finally:
            conn.leave_if_done()


class GatedConnection(sqlite3.Connection):
    """A connection whose writes take its database's gate (module doc)."""

    def __init__(self, database, *args, **kwargs) -> None:
        super().__init__(database, *args, **kwargs)
        self.gate = gate_for(os.fspath(database))
        self.holding = False
        self.wait_s = float(kwargs.get("timeout", 5.0))

    def cursor(self, factory=GatedCursor):  # type: ignore[override]
        return super().cursor(factory)

    def execute(self, sql, parameters=(), /):  # type: ignore[override]
        return self.cursor().execute(sql, parameters)

    def executemany(self, sql, seq_of_parameters, /):  # type: ignore[override]
        return self.cursor().executemany(sql, seq_of_parameters)

    def enter(self) -> None:
        assert self.gate is not None
        if not self.gate.acquire(timeout=self.wait_s):
            raise sqlite3.OperationalError("database is locked")
        self.holding = True

    def leave_if_done(self) -> None:
        """Give the gate back when no transaction is open any more (it ended, or never began)."""
        if self.holding and not self.in_transaction:
            self._leave()

    def _leave(self) -> None:
        self.holding = False
        self.gate.release()  # type: ignore[union-attr]

    def commit(self) -> None:
        try:
            super().commit()
        finally:
            self.leave_if_done()

    def rollback(self) -> None:
        try:
            super().rollback()
        finally:
            self.leave_if_done()

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self.holding:  # closed: its transaction is gone (and in_transaction cannot be read)
                self._leave()
