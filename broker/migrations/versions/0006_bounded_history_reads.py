"""Reads that do not grow with the store's history: a total order for paged lease listings, and
indexes for the live leases and the recently ended ones.

Revision 0006, after 0005.

- ``ix_leases_created_at_lease_id`` and ``ix_leases_tenant_created_at_lease_id`` replace 0005's
  ``ix_leases_created_at`` and ``ix_leases_tenant_created_at``: a listing is ordered by creation
  time and then id, so a page token (the last lease's time and id) continues exactly where the
  previous page stopped, even among leases created at the same instant, and the index still
  gives the order without a sort.
- ``ix_leases_tenant_state_ended_at``: a tenant's live leases, and its leases that ended this
  month (the budget sums their spend in the database instead of reading each one on every launch).
- ``ix_leases_state_ended_at`` replaces ``ix_leases_state``: the live leases, and the leases
  ended since a time (/metrics reads those of the last hour and counts older ones once).
- ``ix_lease_events_at``: the events of the last hour (/metrics, likewise).
"""
from __future__ import annotations

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_leases_created_at_lease_id", "leases", ["created_at", "lease_id"], unique=False)
    op.create_index("ix_leases_tenant_created_at_lease_id", "leases", ["tenant", "created_at", "lease_id"],
                    unique=False)
    op.drop_index("ix_leases_tenant_created_at", table_name="leases")
    op.drop_index("ix_leases_created_at", table_name="leases")
    op.create_index("ix_leases_tenant_state_ended_at", "leases", ["tenant", "state", "ended_at"], unique=False)
    op.create_index("ix_leases_state_ended_at", "leases", ["state", "ended_at"], unique=False)
    op.drop_index("ix_leases_state", table_name="leases")
    op.create_index("ix_lease_events_at", "lease_events", ["at"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_lease_events_at", table_name="lease_events")
    op.create_index("ix_leases_state", "leases", ["state"], unique=False)
    op.drop_index("ix_leases_state_ended_at", table_name="leases")
    op.drop_index("ix_leases_tenant_state_ended_at", table_name="leases")
    op.create_index("ix_leases_created_at", "leases", ["created_at"], unique=False)
    op.create_index("ix_leases_tenant_created_at", "leases", ["tenant", "created_at"], unique=False)
    op.drop_index("ix_leases_tenant_created_at_lease_id", table_name="leases")
    op.drop_index("ix_leases_created_at_lease_id", table_name="leases")
