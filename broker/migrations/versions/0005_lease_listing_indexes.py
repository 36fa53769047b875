"""Lease listings: indexes on the leases' creation time (``ix_leases_created_at``, and
``ix_leases_tenant_created_at``, which replaces ``ix_leases_tenant``).

Revision 0005, after 0004. A listing of the newest leases (ListLeases, ``broker leases``) read
every lease the store keeps and sorted them to return the first ``limit``: its cost grew with the
ended leases, on every call. With these indexes it reads only the rows it returns, for every
tenant or one. The tenant's index leads with the tenant, so it also serves the lookups by tenant
the index it replaces served.
"""
from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_leases_created_at", "leases", ["created_at"], unique=False)
    op.create_index("ix_leases_tenant_created_at", "leases", ["tenant", "created_at"], unique=False)
    op.drop_index("ix_leases_tenant", table_name="leases")


def downgrade() -> None:
    op.create_index("ix_leases_tenant", "leases", ["tenant"], unique=False)
    op.drop_index("ix_leases_tenant_created_at", table_name="leases")
    op.drop_index("ix_leases_created_at", table_name="leases")
