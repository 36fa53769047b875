"""SQLite writers of one process take turns on a lock per database file (broker.sqlite_gate):
every way a transaction ends gives the lock back, reads never take it, and a writer that cannot
have it fails as SQLite fails."""
from __future__ import annotations

import sqlite3
import threading

import pytest
from sqlalchemy import text

from broker.engine import engine_for
from broker.sqlite_gate import GatedConnection, gate_for, starts_write


def connect(path, timeout=5.0) -> GatedConnection:
    return sqlite3.connect(path, factory=GatedConnection, check_same_thread=False, timeout=timeout)


@pytest.fixture
def db(tmp_path):
    path = str(tmp_path / "g.db")
    c = sqlite3.connect(path)
    c.execute("PRAGMA journal_mode=WAL")
    c.execute("CREATE TABLE t (x INTEGER PRIMARY KEY)")
    c.commit()
    c.close()
    return path


@pytest.mark.parametrize("sql, write", [
    ("INSERT INTO t VALUES (1)", True), ("  update t set x = 2", True), ("\nDELETE FROM t", True),
    ("REPLACE INTO t VALUES (1)", True), ("CREATE TABLE u (y)", True), ("drop table u", True),
    ("ALTER TABLE t ADD COLUMN z", True), ("BEGIN IMMEDIATE", True), ("begin exclusive", True),
    ("BEGIN", False), ("SELECT * FROM t", False), ("PRAGMA journal_mode=WAL", False), ("", False),
    ("WITH a AS (SELECT 1) SELECT * FROM a", False), ("COMMIT", False),
])
def test_the_statements_sqlite_takes_its_write_lock_for(sql, write):
    assert starts_write(sql) is write


def test_every_end_of_a_transaction_gives_the_gate_back(db):
    gate = gate_for(db)
    c = connect(db)
    for end in (c.commit, c.rollback):
        c.execute("INSERT INTO t DEFAULT VALUES")
        assert c.holding and gate.locked()
        end()
        assert not c.holding and not gate.locked()
    c.execute("BEGIN IMMEDIATE")
    assert gate.locked()
    c.execute("COMMIT")  # a statement that ends the transaction
    assert not gate.locked()
    c.execute("CREATE TABLE u (y)")  # DDL outside a transaction: done when it returns
    assert not gate.locked()
    with pytest.raises(sqlite3.IntegrityError):
        c.execute("INSERT INTO t VALUES (1), (1)")  # fails; the implicit transaction stays open
    c.rollback()
    assert not gate.locked()
    c.executemany("INSERT INTO t DEFAULT VALUES", [(), ()])
    assert gate.locked()
    c.close()  # closing rolls back, and gives the gate back
    assert not gate.locked()


def test_reads_never_take_the_gate(db):
    gate = gate_for(db)
    w, r = connect(db), connect(db)
    w.execute("INSERT INTO t DEFAULT VALUES")
    assert gate.locked()
    r.execute("BEGIN")  # a read snapshot (the /metrics scrape's)
    assert r.execute("SELECT count(*) FROM t").fetchone() == (0,)
    assert not r.holding
    r.rollback()
    w.commit()
    w.close()
    r.close()


def test_a_waiting_writer_goes_when_the_writer_before_it_ends(db):
    a, b = connect(db), connect(db)
    a.execute("INSERT INTO t DEFAULT VALUES")
    done = threading.Event()

    def write():
        b.execute("INSERT INTO t DEFAULT VALUES")
        b.commit()
        done.set()

    th = threading.Thread(target=write)
    th.start()
    assert not done.wait(0.3)  # it waits (on the gate: SQLite's lock is not asked for yet)
    assert not b.holding
    a.commit()
    assert done.wait(10)
    th.join()
    assert a.execute("SELECT count(*) FROM t").fetchone() == (2,)
    a.close()
    b.close()


def test_a_writer_that_cannot_have_the_gate_fails_as_sqlite_does(db):
    a, b = connect(db), connect(db, timeout=0.2)
    a.execute("INSERT INTO t DEFAULT VALUES")
    with pytest.raises(sqlite3.OperationalError, match="database is locked"):
        b.execute("INSERT INTO t DEFAULT VALUES")
    assert not b.holding and not b.in_transaction
    a.commit()
    b.execute("INSERT INTO t DEFAULT VALUES")
    b.commit()
    assert not gate_for(db).locked()
    a.close()
    b.close()


def test_a_writer_of_another_process_is_still_waited_for_by_sqlite(db):
    """The gate orders this process's writers; SQLite's own lock still orders the others."""
    other = sqlite3.connect(db, timeout=5)  # not gated, as another process's connection
    other.execute("BEGIN IMMEDIATE")
    mine = connect(db, timeout=0.3)
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        mine.execute("INSERT INTO t DEFAULT VALUES")
    other.rollback()
    mine.execute("INSERT INTO t DEFAULT VALUES")
    mine.commit()
    assert not gate_for(db).locked()
    other.close()
    mine.close()


def test_one_gate_per_database_file(tmp_path, db):
    assert gate_for(db) is gate_for(str(tmp_path / "." / "g.db"))
    assert gate_for(db) is not gate_for(str(tmp_path / "other.db"))
    assert gate_for(":memory:") is None and gate_for("") is None


def test_the_stores_engines_share_the_gate_and_many_writers_all_commit(tmp_path):
    url = f"sqlite:///{tmp_path / 'broker.db'}"
    engines = [engine_for(url, pool_size=8), engine_for(url, pool_size=8)]
    with engines[0].begin() as c:
        c.execute(text("CREATE TABLE n (k INTEGER PRIMARY KEY, who TEXT)"))
    errors: list[BaseException] = []

    def writer(w: int) -> None:
        try:
            for k in range(25):
                with engines[w % 2].begin() as c:
                    c.execute(text("SELECT count(*) FROM n")).scalar()
                    c.execute(text("INSERT INTO n (who) VALUES (:w)"), {"w": f"{w}-{k}"})
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(12)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not errors
    with engines[1].connect() as c:
        assert c.execute(text("SELECT count(*) FROM n")).scalar() == 12 * 25
    assert not gate_for(str(tmp_path / "broker.db")).locked()
    for e in engines:
        e.dispose()
