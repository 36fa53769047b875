"""Capacity Blocks: the start of the block bought for a lease (``leases.starts_at``).

Revision 0004, after 0003. Additive: a replica of the previous release ignores the new column
(its default, 0, reads as "no block bought").
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("leases") as batch:
        batch.add_column(sa.Column("starts_at", sa.Float(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("leases") as batch:
        batch.drop_column("starts_at")
