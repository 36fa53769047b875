"""Schema migrations of the store (Alembic), run by the store itself when it opens.

The revisions live in ``broker/migrations/versions/`` (``0001_baseline`` is the schema every
release before migrations created with ``create_all``). :func:`upgrade` brings a database to the
newest revision this code knows, in one transaction:

- PostgreSQL: under a transaction advisory lock (:data:`LOCK`), so replicas starting together
  upgrade one after the other (the later ones find nothing left to do);
- SQLite: under the database's write lock (``BEGIN IMMEDIATE``).

A database stamped with a revision this code does not know (written by a newer release) is
refused with :class:`broker.errors.ConfigError`: an older broker must not run on it. A database
made before migrations (tables present, no ``alembic_version``) is brought to the baseline —
missing tables created, 32-bit money and counter columns widened to BIGINT — and stamped.

Writing a revision: change the models, then ``python -m broker.migrate revision "what changes"``
autogenerates ``versions/NNNN_what_changes.py`` against a scratch database at the newest
revision; read it, adjust it, and commit it with the model change (tests/test_migrations.py
fails while the models and the migrations disagree).
"""
from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker.errors import ConfigError

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import ScriptDirectory
    from sqlalchemy.engine import Connection, Engine

#: Where the migration environment and its revisions are (shipped as package data).
MIGRATIONS = Path(__file__).resolve().parent / "migrations"

#: The PostgreSQL advisory lock that serialises schema changes across replicas ("brok").
LOCK = 0x62726F6B

#: Where a database's revision is kept (Alembic's default).
VERSION_TABLE = "alembic_version"

#: The revision every database made before migrations is adopted at.
BASELINE = "0001"

#: Tables the store has always had: their presence without ``alembic_version`` marks a database
#: made before migrations.
PRE_MIGRATION_MARK = "leases"


def _render_item(kind: str, obj: Any, autogen_context: Any) -> Any:
    """Revisions name plain SQLAlchemy types: SQLModel's ``AutoString`` is ``sa.String()``."""
    if kind == "type" and type(obj).__name__ == "AutoString":
        return f"sa.String({obj.length})" if obj.length else "sa.String()"
    return False


#: How the environment compares and renders (env.py and :func:`broker.schema.differences` share them).
OPTIONS: dict[str, Any] = {
    "compare_type": True,
    "compare_server_default": False,
    "render_as_batch": True,  # SQLite alters a table by copying it; batch operations do that
    "render_item": _render_item,
}


def config(connection: "Connection | None" = None) -> "Config":
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("file_template", "%%(rev)s_%%(slug)s")
    cfg.attributes["connection"] = connection
    return cfg


@functools.cache
def scripts() -> "ScriptDirectory":
    """The revisions this code knows (read once per process)."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(config())


def head() -> str:
    """The newest revision this code knows."""
    return scripts().get_current_head()


def history() -> list[dict]:
    """The revisions this code knows, oldest first: revision, parent, description."""
    revs = list(scripts().walk_revisions())
    return [{"revision": s.revision, "down_revision": s.down_revision, "description": s.doc or ""}
            for s in reversed(revs)]


def newest_file() -> str:
    """The newest revision by its file name alone (revision ``NNNN`` is ``versions/NNNN_*.py``,
    each after the one before: tests/test_migrations.py holds them to it)."""
    return max(p.name.split("_", 1)[0] for p in (MIGRATIONS / "versions").glob("[0-9][0-9][0-9][0-9]_*.py"))


def current(connection: "Connection") -> str | None:
    """The database's revision (None: never migrated)."""
    from alembic.runtime.migration import MigrationContext

    return MigrationContext.configure(connection).get_current_revision()


@dataclass(frozen=True)
class Outcome:
    """What :func:`upgrade` did: the revision before (None: none) and after, and whether the
    database was made before migrations and adopted."""
    before: str | None
    after: str
    adopted: bool

    @property
    def changed(self) -> bool:
        return self.before != self.after

    def as_dict(self) -> dict[str, Any]:
        return {"from": self.before, "to": self.after, "changed": self.changed, "adopted": self.adopted}


def where(url: Any) -> str:
    """The database's URL without its password, for messages."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(str(url)).render_as_string(hide_password=True)
    except Exception:
        return str(url).split("@")[-1]


def _too_new(engine: "Engine", rev: str) -> ConfigError:
    from broker import __version__

    return ConfigError(f"the database at {where(engine.url)} is at schema revision {rev}, which this "
                       f"broker ({__version__}, newest revision {head()}) does not know: run the "
                       f"release that upgraded it, or a newer one.")


def _lock(conn: "Connection") -> None:
    from sqlalchemy import text

    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": LOCK})
    elif conn.dialect.name == "sqlite":
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def status(engine: "Engine") -> dict[str, Any]:
    """Where the database stands, changing nothing: its revision, this code's newest, a status
    (current, behind, empty, pre-migration — made before migrations —, or newer than this code)
    and the revisions it lacks."""
    from sqlalchemy import inspect

    with engine.connect() as conn:
        rev = current(conn)
        made_before = rev is None and inspect(conn).has_table(PRE_MIGRATION_MARK)
    known = [r["revision"] for r in history()]
    if rev is None:
        state, pending = ("pre-migration" if made_before else "empty"), known
    elif rev not in known:
        state, pending = "newer", []
    else:
        pending = known[known.index(rev) + 1:]
        state = "behind" if pending else "current"
    return {"database": where(engine.url), "revision": rev, "head": known[-1], "status": state,
            "pending": pending}


def upgrade(engine: "Engine") -> Outcome:
    """Bring the database to the newest revision (creating the schema of an empty one); a no-op
    on a current one. Raises :class:`ConfigError` when the database is newer than this code."""
    from sqlalchemy import inspect, text

    newest = newest_file()
    with engine.connect() as conn:  # current (every start but the first after a release): no
        if inspect(conn).has_table(VERSION_TABLE):  # lock, and Alembic is not even imported
            if conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().all() == [newest]:
                return Outcome(newest, newest, False)
    from alembic import command

    sd = scripts()
    newest = sd.get_current_head()
    with engine.begin() as conn:
        _lock(conn)
        rev = current(conn)
        if rev == newest:
            return Outcome(rev, rev, False)
        if rev is not None and rev not in {s.revision for s in sd.walk_revisions()}:
            raise _too_new(engine, rev)
        adopted = rev is None and inspect(conn).has_table(PRE_MIGRATION_MARK)
        command.upgrade(config(conn), "head")
    return Outcome(rev, newest, adopted)


def revision(message: str) -> Path:
    """Autogenerate the next revision (``NNNN_slug.py``) from the models' difference to the
    newest revision, computed on a scratch SQLite database; returns its path."""
    import tempfile

    from alembic import command
    from sqlalchemy import create_engine

    sd = scripts()
    number = 1 + max((int(s.revision) for s in sd.walk_revisions() if s.revision.isdigit()), default=0)
    with tempfile.TemporaryDirectory() as tmp:
        engine = create_engine(f"sqlite:///{tmp}/scratch.db")
        try:
            upgrade(engine)
            with engine.begin() as conn:
                script = command.revision(config(conn), message, autogenerate=True, rev_id=f"{number:04d}")
        finally:
            engine.dispose()
    return Path(script.path)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "revision" or not argv[1].strip():
        sys.stderr.write('usage: python -m broker.migrate revision "what the revision changes"\n')
        return 2
    sys.stdout.write(f"{revision(argv[1])}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
