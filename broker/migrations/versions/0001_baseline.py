"""Baseline: the schema every release before migrations created.

Revision 0001, the first.

An empty database gets every table. A database made before migrations (by ``create_all``) is
brought to exactly this schema: it has some of these tables (the market's appears on its first
refresh, the leader's only on PostgreSQL), so the missing ones are created; and one made before
money and counters were 64-bit has 32-bit columns on PostgreSQL, which are widened to BIGINT.
"""
from __future__ import annotations

from typing import Callable

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

#: Money (micro-dollars) and counters: 64-bit; SQLite's INTEGER is 64-bit already (and the rowid).
INT64 = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _quotes() -> list:
    return [
        sa.Column("quote_id", sa.String(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("valid_until", sa.Float(), nullable=False),
        sa.Column("body", sa.String(), nullable=False),
        sa.PrimaryKeyConstraint("quote_id"),
    ]


def _leases() -> list:
    return [
        sa.Column("lease_id", sa.String(), nullable=False),
        sa.Column("tenant", sa.String(), nullable=False),
        sa.Column("idempotency_key", sa.String(), nullable=False),
        sa.Column("state", sa.String(), nullable=False),
        sa.Column("state_reason", sa.String(), nullable=False),
        sa.Column("version", INT64, nullable=False),
        sa.Column("provider", sa.String(), nullable=False),
        sa.Column("region", sa.String(), nullable=False),
        sa.Column("zone", sa.String(), nullable=False),
        sa.Column("instance_type", sa.String(), nullable=False),
        sa.Column("market", sa.String(), nullable=False),
        sa.Column("nodes", INT64, nullable=False),
        sa.Column("hourly_micros", INT64, nullable=False),
        sa.Column("reservation", sa.String(), nullable=False),
        sa.Column("client_token", sa.String(), nullable=False),
        sa.Column("attempt", INT64, nullable=False),
        sa.Column("quote_id", sa.String(), nullable=False),
        sa.Column("offer_rank", INT64, nullable=False),
        sa.Column("bootstrap", sa.String(), nullable=False),
        sa.Column("job", sa.String(), nullable=False),
        sa.Column("instances", sa.String(), nullable=False),
        sa.Column("demand", sa.String(), nullable=False),
        sa.Column("attempts", sa.String(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.Column("state_since", sa.Float(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("ended_at", sa.Float(), nullable=False),
        sa.Column("accrued_micros", INT64, nullable=False),
        sa.Column("accrued_at", sa.Float(), nullable=False),
        sa.Column("max_lifetime_s", INT64, nullable=False),
        sa.Column("idle_since", sa.Float(), nullable=False),
        sa.Column("replaces", sa.String(), nullable=False),
        sa.PrimaryKeyConstraint("lease_id"),
        sa.UniqueConstraint("tenant", "idempotency_key", name="uq_lease_idempotency"),
    ]


def _lease_events() -> list:
    return [
        sa.Column("id", INT64, nullable=False),
        sa.Column("lease_id", sa.String(), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("from_state", sa.String(), nullable=False),
        sa.Column("to_state", sa.String(), nullable=False),
        sa.Column("message", sa.String(), nullable=False),
        sa.Column("data", sa.String(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    ]


def _decisions() -> list:
    return [
        sa.Column("decision_id", sa.String(), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("action", sa.String(), nullable=False),
        sa.Column("reason", sa.String(), nullable=False),
        sa.Column("job_ids", sa.String(), nullable=False),
        sa.Column("lease_id", sa.String(), nullable=False),
        sa.Column("data", sa.String(), nullable=False),
        sa.PrimaryKeyConstraint("decision_id"),
    ]


def _blocks() -> list:
    return [
        sa.Column("scope_key", sa.String(), nullable=False),
        sa.Column("until", sa.Float(), nullable=False),
        sa.Column("reason", sa.String(), nullable=False),
        sa.PrimaryKeyConstraint("scope_key"),
    ]


def _snapshots() -> list:
    return [
        sa.Column("source", sa.String(), nullable=False),
        sa.Column("taken_at", sa.Float(), nullable=False),
        sa.Column("body", sa.String(), nullable=False),
        sa.PrimaryKeyConstraint("source"),
    ]


def _market_snapshots() -> list:
    return [
        sa.Column("provider", sa.String(length=16), nullable=False),
        sa.Column("fetched_at", sa.Float(), nullable=False),
        sa.Column("attempted_at", sa.Float(), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("provider"),
    ]


def _broker_leader() -> list:
    return [
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("holder", sa.String(), nullable=False),
        sa.Column("term", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    ]


#: table -> (its columns and constraints, its indexed columns)
TABLES: dict[str, tuple[Callable[[], list], tuple[str, ...]]] = {
    "quotes": (_quotes, ("valid_until",)),
    "leases": (_leases, ("idempotency_key", "state", "tenant")),
    "lease_events": (_lease_events, ("lease_id",)),
    "decisions": (_decisions, ("at",)),
    "blocks": (_blocks, ()),
    "snapshots": (_snapshots, ()),
    "market_snapshots": (_market_snapshots, ()),
    "broker_leader": (_broker_leader, ()),
}

#: The 64-bit columns a database made before money and counters were 64-bit has as INTEGER.
WIDE = {
    "leases": ("version", "nodes", "hourly_micros", "attempt", "offer_rank", "accrued_micros", "max_lifetime_s"),
    "lease_events": ("id",),
    "broker_leader": ("term",),
}


def upgrade() -> None:
    bind = op.get_bind()
    present = set(sa.inspect(bind).get_table_names())
    for table, (columns, indexed) in TABLES.items():
        if table in present:
            continue
        op.create_table(table, *columns())
        for column in indexed:
            op.create_index(op.f(f"ix_{table}_{column}"), table, [column], unique=False)
    if bind.dialect.name == "postgresql":
        _widen(bind)
    elif "market_snapshots" in present:
        _market_key_not_null(bind)


def _widen(bind) -> None:
    """INTEGER money and counter columns (and the serial sequence behind one) to BIGINT."""
    narrow = bind.execute(sa.text(
        "SELECT table_name, column_name FROM information_schema.columns "
        "WHERE table_schema = current_schema() AND data_type = 'integer'")).all()
    for table, column in narrow:
        if column in WIDE.get(table, ()):
            op.alter_column(table, column, type_=sa.BigInteger(), existing_type=sa.Integer(),
                            existing_nullable=False)
    for table, columns in WIDE.items():
        for column in columns:
            seq = bind.execute(sa.text("SELECT pg_get_serial_sequence(:t, :c)"),
                               {"t": table, "c": column}).scalar()
            if seq is not None and bind.execute(sa.text(
                    "SELECT seqtypid = 'integer'::regtype FROM pg_sequence WHERE seqrelid = CAST(:s AS regclass)"),
                    {"s": seq}).scalar():
                op.execute(sa.text(f"ALTER SEQUENCE {seq} AS BIGINT"))


def _market_key_not_null(bind) -> None:
    """SQLite lets a key that is not an INTEGER be NULL unless it says NOT NULL, which the market's
    first CREATE did not: say it (SQLite alters a column by copying the table)."""
    provider = next(c for c in sa.inspect(bind).get_columns("market_snapshots") if c["name"] == "provider")
    if provider["nullable"]:
        with op.batch_alter_table("market_snapshots") as batch:
            batch.alter_column("provider", existing_type=sa.String(length=16), nullable=False)


def downgrade() -> None:
    for table in reversed(TABLES):
        op.drop_table(table)
