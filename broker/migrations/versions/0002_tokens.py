"""Tokens: bearer tokens issued into the store (``broker tokens``; :mod:`broker.tokens`).

Revision 0002, after 0001. Additive: a replica of the previous release ignores the table.
Only each token's SHA-256 digest is kept, unique, and looked up by it.
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tokens",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("role", sa.String(), nullable=False),
        sa.Column("tenants", sa.String(), nullable=False),
        sa.Column("digest", sa.String(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=True),
        sa.Column("revoked_at", sa.Float(), nullable=True),
        sa.Column("note", sa.String(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_tokens_digest"), "tokens", ["digest"], unique=True)


def downgrade() -> None:
    op.drop_index(op.f("ix_tokens_digest"), table_name="tokens")
    op.drop_table("tokens")
