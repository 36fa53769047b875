"""A reconciler pass's limits in money and time, on clouds in memory (tests/test_reconciler_pass.py's
kit): tenants over budget, a lifetime counted from a lease's start, a warning given in the last
second, a request waiting for its capacity block, and the quotes a pass prunes."""
from __future__ import annotations

from decimal import Decimal

from sqlalchemy import insert, select
from structlog.testing import capture_logs

from broker.config import Budget
from broker.records import Job
from broker.store import QuoteRecord
from policies.budget import over_budget
from providers.base import Market
from tests.test_reconciler_pass import T0, S, make  # noqa: F401  (fixture)


# -- budgets ------------------------------------------------------------------------------------------
def test_a_tenant_over_its_hourly_cap_has_its_newest_leases_released_and_their_jobs_requeued(make):
    k = make(budgets={"default": Budget("default", usd_per_hour=Decimal(10_000)),
                      "research": Budget("research", usd_per_hour=Decimal(10_000))},
             on_exhausted="checkpoint_and_stop")
    oldest = k.launch("a")
    k.clock.advance(1)
    busy = k.launch("b", job=Job(job_id="j"))
    k.clock.advance(1)
    newest = k.launch("c")
    other = k.launch("d", tenant="research")
    rate = oldest.hourly_micros * oldest.nodes
    k.lc.budgets.budgets["default"] = Budget("default", usd_per_hour=Decimal(rate * 3 // 2) / 1_000_000)
    why = over_budget("default", k.lc.budgets.caps("default"), 3 * rate, 0)
    assert why is not None and why.startswith("budget default.usd_per_hour = ")
    report = k.rec.run_pass()
    assert report.expired == 2
    assert [k.lc.get(x.lease_id).state for x in (oldest, busy, newest, other)] == [
        S.RUNNING, S.RELEASED, S.RELEASED, S.RUNNING]
    assert k.lc.get(newest.lease_id).state_reason == why
    assert [e.message for e in k.events(newest.lease_id, "budget")] == [why]
    assert k.lc.get(busy.lease_id).state_reason == (
        f"budget exhausted: {why}; no replacement: budget exhausted: no new spend")
    assert [x.lease_id for x in k.store.list_leases() if x.replaces] == []


def test_a_tenant_whose_budget_cannot_be_judged_stops_no_other_tenants_release(make, monkeypatch):
    k = make(budgets={"default": Budget("default", usd_per_hour=Decimal(10_000))})
    broken, spent = k.launch("a", tenant="broken"), k.launch("b")
    releases = k.lc.budgets.releases

    def judged(tenant, now):
        if tenant == "broken":
            raise RuntimeError("a bug in the budget's arithmetic")
        return releases(tenant, now)

    monkeypatch.setattr(k.lc.budgets, "releases", judged)
    k.lc.budgets.budgets["default"] = Budget("default", usd_per_hour=Decimal("0.01"))
    with capture_logs() as logs:
        report = k.rec.run_pass()
    assert (report.errors, report.expired) == (1, 1) and k.errors == [("budget", "")]
    assert [e["tenant"] for e in logs if e["event"] == "budget_failed"] == ["broken"]
    assert k.lc.get(broken.lease_id).state is S.RUNNING and k.lc.get(spent.lease_id).state is S.RELEASED


# -- time ---------------------------------------------------------------------------------------------
def test_a_leases_lifetime_counts_from_when_it_started_not_from_its_request(make, monkeypatch):
    k = make(idle_timeout_s=0)
    aws = k.clouds["aws"]
    lease, _ = k.lc.create(idempotency_key="k", target=k.target(), max_lifetime_s=1000)
    k.clock.advance(5)
    assert k.rec.run_pass().resumed == 1  # a request left by a crash: launched 5 s after it was made
    started = k.lc.get(lease.lease_id)
    assert (started.state, started.created_at, started.started_at) == (S.RUNNING, T0, T0 + 5)
    k.clock.advance(999)
    listed = aws.list_managed  # its node missing from a lagging listing: the lease is looked at in full
    monkeypatch.setattr(aws, "list_managed", lambda regions=None: [i for i in listed(regions) if i.lease_id != lease.lease_id])
    assert k.rec.run_pass().expired == 0
    monkeypatch.setattr(aws, "list_managed", listed)
    k.clock.advance(1)
    assert k.rec.run_pass().expired == 1
    assert k.lc.get(lease.lease_id).state_reason == "maximum lifetime of 1000 s reached"


def test_a_warning_given_less_than_a_second_before_the_end_says_0_s(make):
    k = make(lifetime_warning_s=100)
    lease = k.launch("k", max_lifetime_s=1000, job=Job(job_id="j"))
    k.clock.advance(999.6)  # the first pass since the warning's window opened
    k.rec.run_pass()
    (ev,) = k.events(lease.lease_id, "lifetime_warning")
    assert ev.message == "job j: the lease reaches its maximum lifetime of 1000 s in 0 s; checkpoint now"


def test_a_request_waiting_for_its_capacity_block_is_launched_at_the_blocks_start(make):
    k = make()
    lease, _ = k.lc.create(idempotency_key="k", target=k.target())
    k.store.update_lease(lease, now=T0, market=Market.RESERVED.value, reservation="cr-1", starts_at=T0 + 3600)
    k.clock.advance(3599)
    assert k.rec.run_pass().resumed == 0 and k.lc.get(lease.lease_id).state is S.REQUESTED
    k.clock.advance(1)
    report = k.rec.run_pass()  # taken up at the block's start (and failed: the cloud in memory sells no blocks)
    assert (report.resumed, report.failed) == (1, 1) and k.lc.get(lease.lease_id).state is S.FAILED


def test_a_pass_prunes_the_quotes_that_expired_a_day_ago_or_more(make):
    k = make()
    day = 86400.0
    with k.store.engine.begin() as conn:
        conn.execute(insert(QuoteRecord.__table__), [
            {"quote_id": q, "created_at": until - 600, "valid_until": until, "body": "{}"}
            for q, until in (("q-old", T0 - day - 0.5), ("q-edge", T0 - day), ("q-new", T0 + 600))])
    k.rec.run_pass()
    with k.store.engine.connect() as conn:
        left = sorted(conn.execute(select(QuoteRecord.__table__.c.quote_id)).scalars())
    assert left == ["q-edge", "q-new"]


def test_quotes_that_cannot_be_pruned_are_counted_logged_and_stop_nothing(make, monkeypatch):
    k = make()
    lease = k.launch("k")
    k.clock.advance(k.lc.settings.idle_timeout_s)

    def locked(before):
        raise RuntimeError("database is locked")

    monkeypatch.setattr(k.store, "prune_quotes", locked)
    with capture_logs() as logs:
        report = k.rec.run_pass()
    assert (report.errors, report.expired) == (1, 1) and k.errors == [("prune", "")]
    (failed,) = [e for e in logs if e["event"].endswith("_failed")]
    assert failed.pop("exc_info") is True and failed == {
        "event": "prune_failed", "log_level": "error", "provider": "", "error": "RuntimeError('database is locked')"}
    assert k.lc.get(lease.lease_id).state is S.RELEASED


def test_a_lease_looked_at_in_full_and_found_steady_stops_no_later_leases_release(make, monkeypatch):
    k = make()
    aws = k.clouds["aws"]
    steady = k.launch("s", job=Job(job_id="j"))  # busy: never idle
    k.clock.advance(1)
    idle = k.launch("i")
    k.clock.advance(k.lc.settings.idle_timeout_s)
    listed = aws.list_managed  # the steady lease's node missing from a lagging listing: read in full
    monkeypatch.setattr(aws, "list_managed", lambda regions=None: [i for i in listed(regions) if i.lease_id != steady.lease_id])
    assert k.rec.run_pass().expired == 1
    assert [k.lc.get(x.lease_id).state for x in (steady, idle)] == [S.RUNNING, S.RELEASED]
