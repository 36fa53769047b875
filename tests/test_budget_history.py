"""A budget check reads a bounded set of rows, whatever the tenant's history (SQLite and
PostgreSQL): the spend of the leases that ended this month after starting in it is summed by the
database, and only live leases and the ones whose spend is prorated come back as rows. The result
is the per-lease computation's, to the micro-dollar (PostgreSQL's SUM over bigint is a Decimal)."""
from __future__ import annotations

import datetime as dt

import pytest

from broker.budget import Budgets, lease_spend_since, month_start
from broker.lease import LIVE, Lease, LeaseState
from broker.store import Store
from tests.stores import db_url  # noqa: F401  (fixture)
from tests.test_store_listing import plan, statements

NOW = dt.datetime(2026, 12, 15, 12, tzinfo=dt.timezone.utc).timestamp()
SINCE = month_start(NOW)
DAY = 86_400.0
SETTLED = 200  # ended this month after starting in it


def _lease(lid: str, state: str, *, tenant: str = "a", started: float = 0.0, ended: float = 0.0,
           accrued_at: float = 0.0, accrued: int = 0, nodes: int = 1, hourly: int = 2_000_000) -> Lease:
    created = (started or accrued_at or NOW - DAY) - 60
    return Lease(lease_id=lid, tenant=tenant, idempotency_key=lid, state=state, provider="aws", region="us-east-1",
                 instance_type="g5.xlarge", market="on_demand", nodes=nodes, hourly_micros=hourly,
                 client_token=lid, created_at=created, updated_at=created, state_since=created, started_at=started,
                 ended_at=ended, accrued_at=accrued_at, accrued_micros=accrued)


def _history() -> list[Lease]:
    r, x, f, d = (LeaseState.RUNNING, LeaseState.RELEASED, LeaseState.FAILED, LeaseState.DRAINING)
    out = [
        _lease("live-straddles", r, started=SINCE - 3 * DAY, accrued_at=NOW - 3600, accrued=7_777_777, nodes=2),
        _lease("live-this-month", r, started=SINCE + DAY, accrued_at=NOW - 600, accrued=1_234_567),
        _lease("draining", d, started=SINCE + 2 * DAY, accrued_at=NOW - 60, accrued=333_333, hourly=9_000_000),
        _lease("provisioning", LeaseState.PROVISIONING),
        _lease("ended-straddles", x, started=SINCE - 2 * DAY, ended=SINCE + DAY, accrued_at=SINCE + DAY,
               accrued=5_555_555),
        _lease("ended-last-month", x, started=SINCE - 5 * DAY, ended=SINCE - DAY, accrued_at=SINCE - DAY,
               accrued=9_999_999),
        _lease("ended-at-the-month", x, started=SINCE - DAY, ended=SINCE, accrued_at=SINCE, accrued=4_444_444),
        _lease("never-started", f, ended=SINCE + 3 * DAY),
        _lease("block-bought-this-month", x, accrued_at=SINCE + DAY, ended=SINCE + 2 * DAY, accrued=50_000_000),
        _lease("block-bought-before", x, accrued_at=SINCE - DAY, ended=SINCE + DAY, accrued=60_000_000),
        _lease("other-tenant", r, tenant="b", started=SINCE + DAY, accrued_at=NOW - 60, accrued=8_000_000),
    ]
    out += [_lease(f"settled-{i:04d}", x if i % 4 else f, started=SINCE + i * 60, ended=SINCE + i * 60 + 3_000,
                   accrued_at=SINCE + i * 60 + 3_000, accrued=1_000_003 + i)
            for i in range(SETTLED)]
    return out


def _per_lease(leases: list[Lease], tenant: str) -> tuple[int, int]:
    """The budget's figures computed lease by lease over every lease of the tenant."""
    rate = spend = 0
    for l in leases:
        if l.tenant != tenant or not (l.state in LIVE or l.ended_at == 0 or l.ended_at >= SINCE):
            continue
        if l.state in LIVE:
            rate += l.hourly_micros * l.nodes
        if (l.ended_at or NOW) >= SINCE:
            spend += lease_spend_since(l, SINCE, NOW)
    return rate, spend


@pytest.fixture
def store(db_url):  # noqa: F811
    s = Store(db_url)
    for lease in _history():
        s.create_lease(lease)
    yield s
    s.close()


@pytest.mark.parametrize("tenant", ["a", "b", "nobody"])
def test_the_summed_spend_is_the_per_lease_spend_to_the_micro_dollar(store, tenant):
    budgets = Budgets(store, {})
    assert budgets.usage(tenant, NOW) == _per_lease(_history(), tenant)
    if tenant == "a":
        assert budgets.usage(tenant, NOW)[1] > SETTLED * 1_000_003  # the settled leases are in it


def test_a_launch_check_reads_live_and_prorated_leases_only(store):
    """What the admission check is given (inside the insert's transaction): the live leases and
    the two ended this month that started before it; the 200 others are one summed number."""
    seen = []
    store.create_lease(_lease("new", LeaseState.REQUESTED), admit=seen.append, counted_since=SINCE)
    (counted,) = seen
    assert sorted(r.lease_id for r in counted.rows) == ["block-bought-before", "draining", "ended-straddles",
                                                        "live-straddles", "live-this-month", "provisioning"]
    assert counted.settled_micros == sum(1_000_003 + i for i in range(SETTLED)) + 50_000_000
    assert isinstance(counted.settled_micros, int)


def test_the_budget_reads_use_the_tenant_state_index_and_never_scan(store):
    sqls = statements(store, lambda: store.counted("a", SINCE))
    assert len(sqls) == 3
    for sql, params in sqls:
        how = plan(store, sql, params)
        assert "ix_leases_tenant_state_ended_at" in how, how
        if store.is_postgres:
            assert '"Seq Scan"' not in how, how
        else:
            assert "SCAN leases" not in how, how
