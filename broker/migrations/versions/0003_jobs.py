"""Jobs: each lease's job state (``leases.job_state``) and the per-lease callback credentials
its nodes report with (``lease_credentials``; :mod:`broker.jobs`).

Revision 0003, after 0002. Additive: a replica of the previous release ignores the new column
(its default, "", reads as "no job state known") and the new table. Only each credential's
SHA-256 digest is kept, unique, and looked up by it.
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("leases") as batch:
        batch.add_column(sa.Column("job_state", sa.String(), nullable=False, server_default=""))
    op.create_table(
        "lease_credentials",
        sa.Column("digest", sa.String(), nullable=False),
        sa.Column("lease_id", sa.String(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("revoked_at", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("digest"),
    )
    op.create_index(op.f("ix_lease_credentials_lease_id"), "lease_credentials", ["lease_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_lease_credentials_lease_id"), table_name="lease_credentials")
    op.drop_table("lease_credentials")
    with op.batch_alter_table("leases") as batch:
        batch.drop_column("job_state")
