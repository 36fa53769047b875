"""The models the migrations are compared against: every table of the store, whichever module
declares it. Apart from :mod:`broker.migrate` (which the store runs at open and which imports no
model), so the store and the migrations do not import each other; the migration environment
(``broker/migrations/env.py``) and the models==migrations test read the models from here."""
from __future__ import annotations

from typing import TYPE_CHECKING

from sqlmodel import SQLModel

import broker.store  # noqa: F401  quotes, leases, lease_events, decisions, blocks, snapshots, market_snapshots
import broker.tokens  # noqa: F401  tokens
from broker import leader
from broker.migrate import OPTIONS

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine


def target_metadata() -> list:
    """The models every revision is compared against: every table of the store, whichever
    module declares it (a new table's module is imported here)."""
    return [SQLModel.metadata, leader.METADATA]


def differences(engine: "Engine") -> list:
    """What autogenerate finds between the database and the models ([] when they agree)."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    meta = target_metadata()
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts=dict(OPTIONS, target_metadata=meta))
        return compare_metadata(ctx, meta)  # type: ignore[arg-type]  # a list of MetaData, as target_metadata takes
