"""The store's schema migrations on real databases (a SQLite file; a throwaway PostgreSQL database
per test): upgrading is idempotent, the models and the migrations agree, a database newer than
the code is refused, a database made before migrations is adopted, and replicas upgrading one
database at once both succeed."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import BigInteger, Index, Integer, MetaData, create_engine, inspect, text

from broker import migrate, schema
from broker.engine import engine_for
from broker.store import Store
from tests.stores import db_url, pg_url_or_skip  # noqa: F401  (fixture)

ROOT = Path(__file__).resolve().parents[1]
TABLES = {"tokens", "quotes", "leases", "lease_events", "decisions", "blocks", "snapshots", "market_snapshots",
          "broker_leader"}


def broker(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BROKER_")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", "broker", *args], capture_output=True, text=True, env=env,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def cli(*args: str):
    """The command in this process (what the subprocess tests show of a real start is not needed)."""
    from typer.testing import CliRunner

    from broker.cli import app

    return CliRunner().invoke(app, list(args), env={"BROKER_CONFIG": None})


def said(r: subprocess.CompletedProcess) -> list[str]:
    """stderr without the JSON log events: the sentences meant for a person."""
    return [line for line in r.stderr.strip().splitlines() if not line.startswith("{")]


def revision_of(url: str) -> str | None:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return migrate.current(conn)
    finally:
        engine.dispose()


def test_upgrade_creates_an_empty_database_and_is_a_no_op_on_a_current_one(db_url):
    first = cli("db", "upgrade", "--db", db_url, "-o", "json")
    assert first.exit_code == 0, first.output
    out = json.loads(first.stdout)
    assert (out["from"], out["to"], out["changed"], out["adopted"]) == (None, migrate.head(), True, False)
    again = cli("db", "upgrade", "--db", db_url, "-o", "json")
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["changed"] is False
    table = cli("db", "upgrade", "--db", db_url)
    assert table.exit_code == 0 and f"at {migrate.head()}, the newest revision; nothing to do" in table.stdout
    cur = cli("db", "current", "--db", db_url, "-o", "json")
    assert json.loads(cur.stdout)["status"] == "current" and json.loads(cur.stdout)["revision"] == migrate.head()
    engine = create_engine(db_url)
    try:
        assert TABLES | {"alembic_version"} <= set(inspect(engine).get_table_names())
    finally:
        engine.dispose()
    s = Store(db_url)  # the store opens a current database without changing it
    s.close()
    assert revision_of(db_url) == migrate.head()


def test_the_store_upgrades_an_empty_database_by_itself(db_url):
    s = Store(db_url)
    try:
        with s.engine.connect() as conn:
            assert migrate.current(conn) == migrate.head()
    finally:
        s.close()


def test_the_models_and_the_migrations_agree(db_url):
    """What the revisions build is what the models declare (autogenerate finds nothing to do)."""
    engine = engine_for(db_url)
    try:
        migrate.upgrade(engine)
        assert schema.differences(engine) == []
    finally:
        engine.dispose()


def test_a_difference_between_models_and_database_is_found(db_url):
    """The agreement test can fail: a column the migrations did not make is reported."""
    engine = engine_for(db_url)
    try:
        migrate.upgrade(engine)
        with engine.begin() as conn:
            conn.execute(text("ALTER TABLE blocks ADD COLUMN stray VARCHAR"))
        diff = schema.differences(engine)
        assert [(d[0], d[3].name) for d in diff] == [("remove_column", "stray")]
    finally:
        engine.dispose()


def test_a_database_at_a_revision_newer_than_the_code_is_refused(db_url, tmp_path):
    engine = engine_for(db_url)
    try:
        migrate.upgrade(engine)
        with engine.begin() as conn:
            conn.execute(text("UPDATE alembic_version SET version_num = '0999'"))
    finally:
        engine.dispose()
    for args in (["db", "upgrade", "--db", db_url],
                 ["serve", "--db", db_url, "--listen", "127.0.0.1:0"]):
        r = broker(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert "Traceback" not in r.stderr
        [sentence] = said(r)
        assert sentence.startswith("broker: ") and "schema revision 0999" in sentence, sentence
        assert "does not know" in sentence
    cur = cli("db", "current", "--db", db_url, "-o", "json")
    assert cur.exit_code == 0, cur.output
    assert json.loads(cur.stdout)["status"] == "newer"
    assert revision_of(db_url) == "0999"  # left as it was


#: Columns of the store's tables that revisions after the baseline added (0003: leases.job_state,
#: 0004: leases.starts_at).
LATER_COLUMNS = {"leases": ("job_state", "starts_at")}
#: Indexes revisions after the baseline made (0005, replaced by 0006's), and the baseline's ones they
#: replaced.
LATER_INDEXES = {"leases": ("ix_leases_created_at_lease_id", "ix_leases_tenant_created_at_lease_id",
                            "ix_leases_tenant_state_ended_at", "ix_leases_state_ended_at"),
                 "lease_events": ("ix_lease_events_at",)}
EARLIER_INDEXES = {"leases": (("ix_leases_tenant", "tenant"), ("ix_leases_state", "state"))}


def _old_schema(url: str, *, market_refreshed: bool) -> None:
    """The schema as releases before migrations made it: ``create_all`` of the store's tables
    (32-bit money and counters on PostgreSQL, as the earliest ones had), the leader's table on
    PostgreSQL only, the market's table only once a refresh had run (its own CREATE)."""
    from sqlmodel import SQLModel

    from broker import leader

    engine = create_engine(url)
    pg = engine.dialect.name == "postgresql"
    old = MetaData()
    for name in ("quotes", "leases", "lease_events", "decisions", "blocks", "snapshots"):
        t = SQLModel.metadata.tables[name].to_metadata(old)
        for column in LATER_COLUMNS.get(name, ()):  # added by a revision after the baseline
            t._columns.remove(t.c[column])
        for index in [i for i in t.indexes if i.name in LATER_INDEXES.get(name, ())]:
            t.indexes.remove(index)
        for index, column in EARLIER_INDEXES.get(name, ()):
            Index(index, t.c[column])
        if pg:
            for c in t.columns:
                if isinstance(c.type, BigInteger):
                    c.type = Integer()
    if pg:
        leader.METADATA.tables["broker_leader"].to_metadata(old)
    try:
        with engine.begin() as conn:
            old.create_all(conn)
            if market_refreshed:
                conn.execute(text(
                    "CREATE TABLE IF NOT EXISTS market_snapshots (provider VARCHAR(16) PRIMARY KEY, "
                    "fetched_at FLOAT NOT NULL, attempted_at FLOAT NOT NULL, last_error TEXT NOT NULL, "
                    "body TEXT NOT NULL)"))
                conn.execute(text("INSERT INTO market_snapshots VALUES ('aws', 1.0, 2.0, '', '{}')"))
            conn.execute(text("INSERT INTO blocks VALUES ('aws/us-east-1', 1e12, 'capacity')"))
    finally:
        engine.dispose()


@pytest.mark.parametrize("market_refreshed", [False, True], ids=["before-a-refresh", "after-a-refresh"])
def test_a_database_made_before_migrations_is_brought_to_the_baseline_and_stamped(db_url, market_refreshed):
    from tests.test_store import lease

    _old_schema(db_url, market_refreshed=market_refreshed)
    assert json.loads(cli("db", "current", "--db", db_url, "-o", "json").stdout)["status"] == "pre-migration"
    r = cli("db", "upgrade", "--db", db_url, "-o", "json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert (out["from"], out["to"], out["adopted"]) == (None, migrate.head(), True)
    assert revision_of(db_url) == migrate.head()
    store = Store(db_url)
    try:
        assert schema.differences(store.engine) == []  # exactly the models' schema, BIGINT included
        assert store.active_blocks(0.0) == {"aws/us-east-1": "capacity"}  # the data stayed
        with store.engine.connect() as conn:
            markets = conn.execute(text("SELECT provider FROM market_snapshots")).scalars().all()
        assert markets == (["aws"] if market_refreshed else [])
        l, _ = store.create_lease(lease())
        l = store.update_lease(l, now=2.0, accrued_micros=3 * 2**31)  # past 32 bits: $6,442
        assert store.get_lease(l.lease_id).accrued_micros == 3 * 2**31
        if store.is_postgres:
            with store.engine.connect() as conn:
                seq = conn.execute(text(
                    "SELECT format_type(seqtypid, NULL) FROM pg_sequence "
                    "WHERE seqrelid = pg_get_serial_sequence('lease_events', 'id')::regclass")).scalar()
            assert seq == "bigint"
    finally:
        store.close()


def _waiting_for_the_schema_lock(conn, database: str) -> int:
    return conn.execute(text(
        "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
        "WHERE l.locktype = 'advisory' AND NOT l.granted AND l.classid = 0 AND l.objid = :k "
        "AND d.datname = :db"), {"k": migrate.LOCK, "db": database}).scalar()


def test_two_processes_upgrading_one_postgresql_database_at_once_both_succeed():
    """Both wait on the schema lock (held here until both are queued on it), then one upgrades
    and the other finds the database current."""
    gen = pg_url_or_skip()
    url = next(gen)
    try:
        database = url.rsplit("/", 1)[1]
        holder = create_engine(url)
        watcher = create_engine(url)
        procs = []
        try:
            with holder.connect() as conn:
                tx = conn.begin()
                conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": migrate.LOCK})
                env = {k: v for k, v in os.environ.items() if not k.startswith("BROKER_")}
                env["PYTHONPATH"] = str(ROOT)
                procs = [subprocess.Popen([sys.executable, "-m", "broker", "db", "upgrade", "--db", url, "-o", "json"],
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                          stdin=subprocess.DEVNULL) for _ in range(2)]
                deadline = time.monotonic() + 120
                with watcher.connect() as w:
                    while _waiting_for_the_schema_lock(w, database) < 2:
                        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
                        assert time.monotonic() < deadline, "the upgrades never queued on the schema lock"
                        time.sleep(0.1)
                tx.rollback()
            outs = [p.communicate(timeout=120) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            holder.dispose()
            watcher.dispose()
        assert [p.returncode for p in procs] == [0, 0], [err for _, err in outs]
        done = sorted((json.loads(out)["from"] or "", json.loads(out)["changed"]) for out, _ in outs)
        assert done == [("", True), (migrate.head(), False)]
        assert revision_of(url) == migrate.head()
    finally:
        next(gen, None)


@pytest.mark.parametrize("args, words", [
    (["db", "upgrade", "--db", "postgresql+psycopg://broker@127.0.0.1:1/broker"],
     "cannot open the store at postgresql+psycopg://broker@127.0.0.1:1/broker: connection failed"),
    (["db", "current", "--db", "postgresql+psycopg://broker@127.0.0.1:1/broker"],
     "cannot open the store at postgresql+psycopg://broker@127.0.0.1:1/broker"),
])
def test_an_unreachable_database_is_exit_7_and_one_sentence(args, words):
    """Unavailable, as `broker tokens list` says for the same database: not the URL's fault."""
    r = cli(*args)
    assert r.exit_code == 7, r.output
    [sentence] = r.stderr.strip().splitlines()
    assert sentence.startswith("broker: ") and words in sentence, sentence


@pytest.mark.parametrize("args, words", [
    (["db", "upgrade", "--db", "mysql://db/broker"], "config: store.url must be sqlite:///PATH or postgresql"),
    (["db", "upgrade", "--db", "sqlite:////dev/null/broker.db"], "cannot open the store at sqlite:////dev/null/broker.db"),
    (["db", "current", "--db", "sqlite:////nowhere/broker.db"], "there is no database at /nowhere/broker.db"),
    (["db", "current", "-o", "yaml"], "--format must be table or json"),
])
def test_a_bad_url_or_an_unusable_database_is_exit_2_and_one_sentence(args, words):
    r = cli(*args)
    assert r.exit_code == 2, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)
    assert r.stdout == ""
    [sentence] = r.stderr.strip().splitlines()
    assert sentence.startswith("broker: ") and words in sentence, sentence
    assert not Path("/nowhere").exists()


def test_history_lists_the_revisions_oldest_first_the_newest_marked():
    r = cli("db", "history", "-o", "json")
    assert r.exit_code == 0, r.output
    revs = json.loads(r.stdout)
    assert revs[0] == {"revision": migrate.BASELINE, "down_revision": None, "head": len(revs) == 1,
                       "description": "Baseline: the schema every release before migrations created."}
    assert [x["head"] for x in revs] == [False] * (len(revs) - 1) + [True]
    for older, newer in zip(revs, revs[1:]):
        assert newer["down_revision"] == older["revision"]
    table = cli("db", "history")
    assert table.exit_code == 0 and f"{revs[-1]['revision']} (newest)" in table.stdout
    assert "``" not in table.stdout and ":mod:" not in table.stdout and "broker.tokens" in table.stdout


def test_revisions_are_numbered_files_in_one_line():
    """Revision NNNN is versions/NNNN_*.py and comes after NNNN-1: the store finds a current
    database current by the file names alone, without loading Alembic."""
    scripts = list(reversed(list(migrate.scripts().walk_revisions())))
    assert [s.revision for s in scripts] == [f"{i:04d}" for i in range(1, len(scripts) + 1)]
    for before, s in zip([None, *scripts], scripts):
        assert Path(s.path).name.startswith(f"{s.revision}_")
        assert s.down_revision == (before.revision if before else None)
    assert migrate.newest_file() == migrate.head()


def test_every_migration_file_is_package_data():
    """The wheel carries the environment, the template and every revision."""
    import fnmatch
    import tomllib

    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["broker"]
    files = [p.relative_to(ROOT / "broker").as_posix() for p in (ROOT / "broker" / "migrations").rglob("*")
             if p.is_file() and "__pycache__" not in p.parts]
    assert {"migrations/env.py", "migrations/script.py.mako", "migrations/versions/0001_baseline.py"} <= set(files)
    for f in files:
        assert any(fnmatch.fnmatch(f, g) for g in globs), f"{f} is not in [tool.setuptools.package-data]"


def test_revisions_carry_no_creation_date():
    """Regenerating a revision gives the same file: nothing in it depends on when it was made."""
    for path in (ROOT / "broker" / "migrations").rglob("*"):
        if path.is_file() and path.suffix in (".py", ".mako"):
            assert "Create Date" not in path.read_text(), path
