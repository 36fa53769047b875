"""A listing of the newest leases (the first page, or the one after a page token) reads only the
rows it returns, however many ended leases the store keeps (SQLite and PostgreSQL): the database
walks an index in creation order and stops at the limit, instead of reading and sorting every
lease on each ListLeases."""
from __future__ import annotations

import json

import pytest
from sqlalchemy import event

from broker.lease import Lease, LeaseState
from broker.store import Store
from tests.stores import db_url  # noqa: F401  (fixture)


def lease(i: int, tenant: str) -> Lease:
    at = 1_000.0 + i
    return Lease(lease_id=f"l-{i:05d}", tenant=tenant, idempotency_key=f"k-{i}", state="requested", provider="aws",
                 region="us-east-1", instance_type="g5.xlarge", market="on_demand", nodes=1,
                 hourly_micros=1_006_000, client_token=f"t-{i}", created_at=at, updated_at=at, state_since=at)


@pytest.fixture
def store(db_url):  # noqa: F811
    s = Store(db_url)
    for i in range(120):  # most ended, as a long-running broker's store holds them
        made, _ = s.create_lease(lease(i, "a" if i % 2 else "b"))
        if i % 10:
            s.update_lease(made, now=made.created_at, state=LeaseState.FAILED, message="failed", ended_at=2_000.0)
    yield s
    s.close()


def statements(store: Store, call) -> list[tuple[str, object]]:
    """The SQL ``call()`` runs on ``store``, with its parameters."""
    seen: list[tuple[str, object]] = []

    def record(conn, cursor, statement, params, context, executemany):
        seen.append((statement, params))

    event.listen(store.engine, "before_cursor_execute", record)
    try:
        call()
    finally:
        event.remove(store.engine, "before_cursor_execute", record)
    return seen


def plan(store: Store, statement: str, params) -> str:
    """The database's plan of ``statement``. On PostgreSQL, sequential scans and sorts are priced
    out, so a sort is in the plan only when no index can give the order (on a table this small the
    planner would otherwise read and sort it whatever indexes there are)."""
    with store.engine.connect() as conn:
        if store.is_postgres:
            conn.exec_driver_sql("SET enable_seqscan = off")
            conn.exec_driver_sql("SET enable_sort = off")
            (doc,) = conn.exec_driver_sql("EXPLAIN (FORMAT JSON) " + statement, params).one()
            conn.rollback()
            return json.dumps(doc if not isinstance(doc, str) else json.loads(doc))
        return " | ".join(r[-1] for r in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, params).all())


@pytest.mark.parametrize("before", [None, (1_100.0, "l-00100")], ids=["first-page", "next-page"])
@pytest.mark.parametrize("tenant", ["", "a"])
def test_the_newest_leases_are_read_by_index_without_sorting_every_lease(store, tenant, before):
    got = []
    [(sql, params)] = statements(store, lambda: got.extend(store.list_leases(tenant=tenant, limit=5, before=before)))
    first = 119 if before is None else 99
    expected = [f"l-{i:05d}" for i in range(first, -1, -1) if not tenant or (i % 2 == 1)][:5]
    assert [l.lease_id for l in got] == expected  # newest first, the tenant's only, after the cursor
    how = plan(store, sql, params)
    index = "ix_leases_tenant_created_at_lease_id" if tenant else "ix_leases_created_at_lease_id"
    if store.is_postgres:
        assert '"Sort"' not in how and '"Incremental Sort"' not in how and "Index Scan" in how, how
        assert index in how, how
    else:
        assert "TEMP B-TREE" not in how, how  # no sort of what the scan read: the index gives the order
        assert index in how, how
