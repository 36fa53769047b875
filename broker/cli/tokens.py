"""`broker tokens create | list | revoke`: bearer tokens kept in the store, for every replica."""
from __future__ import annotations

import sys
from typing import List, Optional

import typer

from broker.cli.app import app, check_format, console, exit_error, exit_usage, fitted_table, print_json

tokens_app = typer.Typer(
    name="tokens", no_args_is_help=True, rich_markup_mode=None,
    help="Bearer tokens kept in the store (its SHA-256 digest only): every replica honours them "
         "next to the config file's [auth] tokens, and a revoked one within [auth] store_cache_s "
         "(2 s). These commands work on the store directly (--db, or [store] url).")
app.add_typer(tokens_app)

DB_HELP = "SQLAlchemy URL of the store (default: [store] url, BROKER_STORE__URL, or the local SQLite)."
CONFIG_HELP = "TOML configuration file (env BROKER_CONFIG)."

CREATE_HELP = """Issue a token and print it, once: the store keeps only its SHA-256 digest.

A tenant token acts for its tenant; a scheduler token reports and watches the
queues it names (--tenant team-a,team-c); an operator token acts for every
tenant (no --tenant). It expires after --expires (90d by default; s, m, h, d
or w; "never" for none). Clients pass it as BROKER_TOKEN.

\b
Examples:
  broker tokens create --tenant team-a --note "team A's CI"
  broker tokens create --role scheduler --tenant team-a,team-c --expires 30d
  broker tokens create --role operator --expires 12h -o json
"""

LIST_HELP = """List the store's tokens, newest first: id, role, tenants, status, expiry and
note, never the token or its digest (only its first hex digits). Active tokens
only unless --all.

\b
Examples:
  broker tokens list
  broker tokens list --all -o json
"""

REVOKE_HELP = """Revoke a token by its id: every replica refuses it (UNAUTHENTICATED) within
[auth] store_cache_s (2 s by default). Revoking a revoked token changes nothing.

\b
Examples:
  broker tokens revoke tok-3f9a1c2b47
"""


def _open(db: Optional[str], config: Optional[str]):
    """(the loaded config, the store) or exit: a bad URL or config is exit 2, a database that
    does not answer exit 7."""
    from broker import config as cfgmod
    from broker.errors import BrokerError, outcome
    from broker.telemetry import configure

    try:
        cfg = cfgmod.load(config, overrides={"store.url": db})
    except BrokerError as e:
        exit_usage(str(e))
    configure("warning")  # opening the store may upgrade its schema: say so only if it goes wrong
    from broker.cli.serve import _reason
    from broker.store import Store

    where = cfg.db_url.split("@")[-1]
    try:
        return cfg, Store(cfg.db_url, connect_timeout_s=cfg.store.connect_timeout_s)
    except BrokerError as e:  # a schema newer than this broker knows
        exit_error(str(e), outcome(e).exit_code)
    except OSError as e:
        exit_usage(f"cannot open the store at {where}: {_reason(e)}.")
    except Exception as e:
        from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError

        from broker.errors import Unavailable

        if isinstance(e, (ArgumentError, NoSuchModuleError)):
            exit_usage(f"--db {where!r} is not a usable database URL: {_reason(e)}.")
        if isinstance(e, SQLAlchemyError):
            exit_error(f"cannot open the store at {where}: {_reason(e)}.", outcome(Unavailable("")).exit_code)
        raise


def _when(ts: Optional[float]) -> str:
    import datetime as dt

    if ts is None:
        return "never"
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%d %H:%M")


@tokens_app.command("create", help=CREATE_HELP)
def create_cmd(
    tenant: Optional[List[str]] = typer.Option(None, "--tenant", help="Tenant it acts for (a scheduler: its queues, comma-separated)."),
    role: str = typer.Option("tenant", "--role", help="tenant, scheduler or operator."),
    expires: str = typer.Option("90d", "--expires", help="Lifetime: 90d, 12h, 30m, 2w, or never."),
    note: str = typer.Option("", "--note", help="What it is for (shown by `broker tokens list`)."),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
    config: Optional[str] = typer.Option(None, "--config", help=CONFIG_HELP, envvar="BROKER_CONFIG"),
    fmt: str = typer.Option("table", "--format", "-o", help="table or json."),
) -> None:
    from broker.tokens import ROLES, TokenStore, check_grant, check_note, parse_duration, token_view

    check_format(fmt)
    try:
        lifetime = parse_duration(expires)
    except ValueError as e:
        exit_usage(f"--expires {e}.")
    if role not in ROLES:
        exit_usage(f"--role must be tenant, scheduler or operator, got {role[:32]!r}.")
    try:
        check_grant(role, tenant or ())
    except ValueError as e:
        exit_usage(f"--tenant: {e}.")
    try:
        check_note(note)
    except ValueError as e:
        exit_usage(f"--note: {e}.")
    cfg, store = _open(db, config)
    try:
        rec, token = TokenStore(store.engine).create(role, tenant or (), lifetime, note)
    finally:
        store.close()
    if cfg.auth is None or not cfg.auth.honours_store:
        why = "has no [auth] section" if cfg.auth is None else "sets auth.store_tokens = false"
        sys.stderr.write(f"broker: note: this configuration {why}, so a server started with it does not "
                         "ask for this token.\n")
    view = token_view(rec, rec.created_at)
    if fmt == "json":
        print_json({**view, "token": token})
        return
    print(f"id       {rec.id}")
    print(f"role     {rec.role} ({rec.tenants})" if rec.role != "operator" else f"role     {rec.role}")
    print(f"expires  {_when(rec.expires_at)}{' UTC' if rec.expires_at is not None else ''}")
    print(f"token    {token}")
    print("The token is shown only this once; the store keeps its SHA-256 digest.")


@tokens_app.command("list", help=LIST_HELP)
def list_cmd(
    all_: bool = typer.Option(False, "--all", help="Include revoked and expired tokens."),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
    config: Optional[str] = typer.Option(None, "--config", help=CONFIG_HELP, envvar="BROKER_CONFIG"),
    fmt: str = typer.Option("table", "--format", "-o", help="table or json."),
) -> None:
    import time

    from broker.tokens import TokenStore, token_view

    check_format(fmt)
    _, store = _open(db, config)
    try:
        rows = TokenStore(store.engine).list(include_inactive=all_)
    finally:
        store.close()
    now = time.time()
    if fmt == "json":
        print_json([token_view(r, now) for r in rows])
        return
    if not rows:
        print("No tokens." if all_ else "No active tokens (--all shows revoked and expired ones).")
        return
    columns = [("id", "left"), ("role", "left"), ("tenants", "left"), ("status", "left"),
               ("expires (UTC)", "left"), ("created (UTC)", "left"), ("sha256", "left"), ("note", "left")]
    table = [(r.id, r.role, r.tenants, r.status(now), _when(r.expires_at), _when(r.created_at),
              r.digest[:8] + "…", r.note) for r in rows]
    # On a narrow terminal the details go first; the id (to paste into `broker tokens revoke`),
    # its role and status always show in full.
    con = console()
    con.print(fitted_table(con, columns, table,
                           drop_first=("sha256", "created (UTC)", "note", "tenants", "expires (UTC)")))


@tokens_app.command("revoke", help=REVOKE_HELP)
def revoke_cmd(
    token_id: str = typer.Argument(..., metavar="ID", help="The token's id (from `broker tokens list`)."),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
    config: Optional[str] = typer.Option(None, "--config", help=CONFIG_HELP, envvar="BROKER_CONFIG"),
    fmt: str = typer.Option("table", "--format", "-o", help="table or json."),
) -> None:
    from broker.tokens import TokenStore, token_view

    check_format(fmt)
    _, store = _open(db, config)
    try:
        rec, now_revoked = TokenStore(store.engine).revoke(token_id)
    except LookupError:
        exit_error(f"there is no token {token_id[:64]!r} (`broker tokens list --all` shows them).", 4)
    finally:
        store.close()
    if fmt == "json":
        print_json({**token_view(rec, rec.revoked_at or 0.0), "revoked_now": now_revoked})
    elif now_revoked:
        print(f"Revoked {rec.id} ({rec.role} {rec.tenants}) at {_when(rec.revoked_at)} UTC.")
    else:
        print(f"{rec.id} was already revoked at {_when(rec.revoked_at)} UTC.")
