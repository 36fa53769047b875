"""${message}

% if down_revision:
Revision ${up_revision}, after ${down_revision | comma,n}.
% else:
Revision ${up_revision}, the first.
% endif
"""
from __future__ import annotations

from alembic import op
import sqlalchemy as sa
${imports if imports else ""}
revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
branch_labels = ${repr(branch_labels)}
depends_on = ${repr(depends_on)}


def upgrade() -> None:
    ${upgrades if upgrades else "pass"}


def downgrade() -> None:
    ${downgrades if downgrades else "pass"}
