"""`broker db upgrade | current | history`: the store's schema revisions (broker/migrate.py)."""
from __future__ import annotations

from typing import Optional

import typer

from broker.cli.app import app, check_format, console, exit_error, exit_usage, print_json

db_app = typer.Typer(
    name="db", no_args_is_help=True, rich_markup_mode=None,
    help="The store's schema: upgrade it, show its revision, list the revisions this broker knows. "
         "broker serve upgrades by itself; these are for doing it first, or looking.")
app.add_typer(db_app)

UPGRADE_HELP = """Bring the store's schema to the newest revision this broker knows: creates
the tables of an empty database, applies the revisions an older one lacks, and brings a database
made before migrations to the baseline and stamps it. A no-op on a current database; safe while
other replicas start (on PostgreSQL it runs under an advisory lock). A database at a revision this
broker does not know (upgraded by a newer release) is refused with exit 2.

\b
Examples:
  broker db upgrade
  broker db upgrade --db postgresql+psycopg://broker@127.0.0.1/broker -o json
"""

CURRENT_HELP = """Show the store's schema revision and how it stands against this broker's
newest: current, behind (the revisions to apply), empty, made before migrations, or newer than
this broker. Changes nothing.

\b
Examples:
  broker db current
  broker db current --db postgresql+psycopg://broker@127.0.0.1/broker -o json
"""

HISTORY_HELP = """List the schema revisions this broker knows, oldest first (the last is the
newest, which broker serve and broker db upgrade bring a database to).

\b
Examples:
  broker db history
  broker db history -o json
"""

DB_OPTION = "SQLAlchemy URL of the store (default: [store] url of --config, else the embedded SQLite)."


def _url(db: Optional[str], config: Optional[str]) -> tuple[str, float]:
    """The store's URL and ``[store] connect_timeout_s``."""
    from broker import config as cfgmod
    from broker.errors import BrokerError

    try:
        cfg = cfgmod.load(config, overrides={"store.url": db})
    except BrokerError as e:
        exit_usage(str(e))
    return cfg.db_url, cfg.store.connect_timeout_s


def _engine(url: str, *, create: bool, connect_timeout_s: float):
    """The store's engine, or exit 2: a URL that is no database URL, a SQLite file that is not
    there (when not ``create``)."""
    from pathlib import Path

    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    from broker.migrate import where
    from broker.engine import engine_for

    if not create and url.startswith("sqlite:///"):
        path = url[len("sqlite:///"):]
        if path and path != ":memory:" and not Path(path).exists():
            exit_usage(f"there is no database at {path} (broker db upgrade or broker serve creates it).")
    try:
        return engine_for(url, create=create, connect_timeout_s=connect_timeout_s)
    except (ArgumentError, NoSuchModuleError, ValueError) as e:
        exit_usage(f"--db {where(url)!r} is not a usable database URL: {_reason(e)}.")
    except OSError as e:
        exit_usage(f"cannot open the store at {where(url)}: {_reason(e)}.")


def _unreachable(e: BaseException) -> bool:
    """No answer from the database server (refused, timed out, gone): not the URL's fault."""
    from sqlalchemy.exc import InterfaceError, OperationalError

    orig = getattr(e, "orig", None)
    return isinstance(e, (OperationalError, InterfaceError)) and not type(orig).__module__.startswith("sqlite3")


def _reason(e: BaseException) -> str:
    from broker.cli.serve import _reason as reason

    return reason(e)


def _run(url: str, connect_timeout_s: float, action, *, create: bool = False):
    """``action(engine)``, one sentence when it fails: a database that does not answer (within
    ``connect_timeout_s``) is exit 7, as for every command; one that cannot be read exit 2."""
    from sqlalchemy.exc import SQLAlchemyError

    from broker.errors import BrokerError, Unavailable, outcome
    from broker.migrate import where

    engine = _engine(url, create=create, connect_timeout_s=connect_timeout_s)
    try:
        return action(engine)
    except BrokerError as e:
        exit_usage(str(e))
    except (SQLAlchemyError, OSError) as e:
        sentence = f"cannot open the store at {where(url)}: {_reason(e)}."
        if _unreachable(e):
            exit_error(sentence, outcome(Unavailable("")).exit_code)
        exit_usage(sentence)
    finally:
        engine.dispose()


@db_app.command("upgrade", help=UPGRADE_HELP)
def upgrade_cmd(
    db: Optional[str] = typer.Option(None, "--db", help=DB_OPTION),
    config: Optional[str] = typer.Option(None, "--config", help="TOML configuration file.", envvar="BROKER_CONFIG"),
    fmt: str = typer.Option("table", "--format", "-o", help="table or json."),
) -> None:
    from broker import migrate

    check_format(fmt)
    url, timeout = _url(db, config)
    done = _run(url, timeout, migrate.upgrade, create=True)
    if fmt == "json":
        print_json({"database": migrate.where(url), **done.as_dict(), "head": done.after})
        return
    place = migrate.where(url)
    if not done.changed:
        typer.echo(f"{place}: at {done.after}, the newest revision; nothing to do.")
    elif done.adopted:
        typer.echo(f"{place}: made before migrations; brought to the baseline {migrate.BASELINE} and "
                   f"upgraded to {done.after}.")
    else:
        typer.echo(f"{place}: upgraded from {done.before or 'an empty database'} to {done.after}.")


SENTENCES = {
    "current": "at {revision}, the newest revision this broker knows.",
    "behind": "at {revision}; {pending} to apply (broker db upgrade, or broker serve, applies them).",
    "empty": "no schema yet (broker db upgrade, or broker serve, creates it at {head}).",
    "pre-migration": "made before migrations, no revision (broker db upgrade, or broker serve, "
                     "brings it to the baseline and stamps it).",
    "newer": "at {revision}, which this broker does not know (its newest is {head}): a newer "
             "release upgraded it.",
}


@db_app.command("current", help=CURRENT_HELP)
def current_cmd(
    db: Optional[str] = typer.Option(None, "--db", help=DB_OPTION),
    config: Optional[str] = typer.Option(None, "--config", help="TOML configuration file.", envvar="BROKER_CONFIG"),
    fmt: str = typer.Option("table", "--format", "-o", help="table or json."),
) -> None:
    check_format(fmt)
    url, timeout = _url(db, config)
    from broker import migrate

    st = _run(url, timeout, migrate.status)
    if fmt == "json":
        print_json(st)
        return
    line = SENTENCES[st["status"]].format(revision=st["revision"], head=st["head"],
                                          pending=", ".join(st["pending"]))
    typer.echo(f"{st['database']}: {line}")


@db_app.command("history", help=HISTORY_HELP)
def history_cmd(fmt: str = typer.Option("table", "--format", "-o", help="table or json.")) -> None:
    from broker import migrate

    check_format(fmt)
    revs = migrate.history()
    head = revs[-1]["revision"] if revs else None
    rows = [{**r, "head": r["revision"] == head} for r in revs]
    if fmt == "json":
        print_json(rows)
        return
    from rich import box
    from rich.table import Table

    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True, show_edge=False)
    t.add_column("revision", no_wrap=True)
    t.add_column("after", no_wrap=True)
    t.add_column("description", overflow="fold")  # wraps on a narrow terminal; ids never do
    for r in rows:
        t.add_row(r["revision"] + (" (newest)" if r["head"] else ""), r["down_revision"] or "-",
                  _plain(r["description"]))
    console().print(t)


def _plain(doc: str) -> str:
    """A migration's docstring as a person reads it: ``x`` and :mod:`x` as x."""
    import re

    return re.sub(r":[a-z]+:`([^`]+)`", r"\1", doc).replace("``", "")
