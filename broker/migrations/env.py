"""The migration environment: runs on the connection :func:`broker.migrate.upgrade` hands it
(already in a transaction, under the schema lock), or on ``sqlalchemy.url`` when run by hand."""
from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from broker.migrate import OPTIONS
from broker.schema import target_metadata

cfg = context.config
connection = cfg.attributes.get("connection")
if context.is_offline_mode():
    context.configure(url=cfg.get_main_option("sqlalchemy.url"), target_metadata=target_metadata(),
                      literal_binds=True, **OPTIONS)
    with context.begin_transaction():
        context.run_migrations()
elif connection is not None:
    context.configure(connection=connection, target_metadata=target_metadata(), **OPTIONS)
    with context.begin_transaction():
        context.run_migrations()
else:
    engine = create_engine(cfg.get_main_option("sqlalchemy.url"))
    try:
        with engine.begin() as conn:
            context.configure(connection=conn, target_metadata=target_metadata(), **OPTIONS)
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()
