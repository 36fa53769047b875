"""Issue #4: budget caps per tenant. A launch over ``usd_per_hour`` is refused (RESOURCE_EXHAUSTED,
CLI exit 3) before anything reaches a cloud; a month spent by accrued cost releases the tenant's
running leases through the reconciler, each with a budget event."""
from __future__ import annotations

import datetime as dt
from decimal import Decimal

import grpc
import pytest

from broker.config import Budget
from broker.v1 import broker_pb2 as pb
from policies.budget import Caps, launch_refusal, over_budget, to_release
from tests.clouds.three import cli, clouds, clouds_server  # noqa: F401
from tests.lease_kit import Clock, Watch, events, live_by_lease, offering, service, serving

pytestmark = pytest.mark.timeout(120)

G5 = 1_006_000  # g5.xlarge on demand in us-east-1, micro-dollars per hour


def _launch(stub, key: str, itype: str = "g5.xlarge", tenant: str = "", count: int = 1):
    return stub.Launch(pb.LaunchRequest(idempotency_key=key, tenant=tenant,
                                        offering=offering("aws", "us-east-1", itype, count=count)), timeout=60).lease


def test_policy_sentences_and_trimming():
    caps = Caps(usd_per_hour_micros=10 * 10**6, usd_per_month_micros=500 * 10**6)
    why = launch_refusal("ml", caps, 9 * 10**6, 0, 2 * 10**6)
    assert why == "budget ml.usd_per_hour = 10 would be exceeded: 9.00 $/h already running + 2.00 $/h requested"
    assert launch_refusal("ml", caps, 8 * 10**6, 0, 2 * 10**6) is None
    assert "usd_per_month = 500 is spent" in launch_refusal("ml", caps, 0, 500 * 10**6, 1)
    assert over_budget("ml", caps, 10 * 10**6, 499 * 10**6) is None
    running = [("a", 4 * 10**6), ("b", 4 * 10**6), ("c", 4 * 10**6)]  # oldest first
    assert set(to_release("ml", caps, running, 12 * 10**6, 0)) == {"c"}
    assert set(to_release("ml", Caps(usd_per_hour_micros=5 * 10**6), running, 12 * 10**6, 0)) == {"b", "c"}
    assert set(to_release("ml", caps, running, 12 * 10**6, 500 * 10**6)) == {"a", "b", "c"}
    assert to_release("ml", caps, running[:2], 8 * 10**6, 0) == {}


def test_launch_over_the_hourly_cap_is_refused(clouds, tmp_path):  # noqa: F811
    budgets = {"default": {"usd_per_hour": 10}, "research": {"usd_per_hour": 100}}
    with service(tmp_path, clouds, budgets=budgets) as svc, serving(svc) as stub:
        _launch(stub, "a", count=2)  # 2.01 $/h
        runs = clouds.aws.count("RunInstances")
        with pytest.raises(grpc.RpcError) as e:
            _launch(stub, "big", "p4d.24xlarge")  # 21.96 $/h
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert e.value.details() == ("budget default.usd_per_hour = 10 would be exceeded: 2.01 $/h already running "
                                     "+ 21.96 $/h requested.")
        assert clouds.aws.count("RunInstances") == runs  # refused before any cloud call
        assert [l.idempotency_key for l in svc.store.list_leases()] == ["a"]  # and before persisting

        r = cli("launch", "--provider", "aws", "--region", "us-east-1", "--instance-type", "p4d.24xlarge",
                "--market", "on_demand", server=stub.address)
        assert r.returncode == 3, r.stderr
        assert "default.usd_per_hour = 10" in r.stderr and "Traceback" not in r.stderr

        # another tenant with its own, larger cap
        big = _launch(stub, "big", "p4d.24xlarge", tenant="research")
        assert big.state == pb.LEASE_STATE_RUNNING
        assert len(live_by_lease(clouds)) == 2


def test_spent_month_releases_running_leases(clouds, tmp_path):  # noqa: F811
    start = dt.datetime(2026, 11, 10, tzinfo=dt.timezone.utc).timestamp()
    clock = Clock(start)
    # idle job-less leases are kept (idle_timeout_s = 0): only the budget releases them here
    with service(tmp_path, clouds, clock=clock, budgets={"default": {"usd_per_month": 50}},
                 lifecycle={"idle_timeout_s": 0}) as svc, serving(svc) as stub:
        a, b = _launch(stub, "a"), _launch(stub, "b")  # 2 x 1.006 $/h
        other = _launch(stub, "other", tenant="research")
        watch = Watch(stub).opened(svc.store)
        try:
            clock.advance(24 * 3600)  # 48.29 $ spent
            svc.reconciler.run_pass()
            assert {svc.store.get_lease(x.lease_id).state for x in (a, b)} == {"running"}

            clock.advance(3600)  # 50.30 $ spent
            svc.reconciler.run_pass()
            for x in (a, b):
                rec = svc.store.get_lease(x.lease_id)
                assert rec.state == "released"
                assert rec.state_reason == "budget default.usd_per_month = 50 exhausted (50.30 $ accrued)"
                assert ("budget", "running", "draining", rec.state_reason) in events(svc.store, x.lease_id)
                assert abs(rec.accrued_micros - G5 * 25) <= 1
            ev = watch.wait_for(lambda e: e.kind == pb.LEASE_EVENT_KIND_BUDGET)
            assert "usd_per_month = 50" in ev.message
        finally:
            watch.close()
        assert svc.store.get_lease(other.lease_id).state == "running"
        assert set(live_by_lease(clouds)) == {other.lease_id}

        with pytest.raises(grpc.RpcError) as e:
            _launch(stub, "c")
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "usd_per_month = 50 is spent: 50.30 $ accrued this month" in e.value.details()

        clock.now = dt.datetime(2026, 12, 1, 0, 0, 1, tzinfo=dt.timezone.utc).timestamp()  # a new month
        assert _launch(stub, "c").state == pb.LEASE_STATE_RUNNING


def test_lowered_hourly_cap_releases_the_newest_leases(clouds, tmp_path):  # noqa: F811
    clock = Clock()
    with service(tmp_path, clouds, clock=clock, budgets={"default": {"usd_per_hour": 10}}) as svc, \
            serving(svc) as stub:
        leases = []
        for k in "abc":
            leases.append(_launch(stub, k))
            clock.advance(1)
        svc.budgets.budgets["default"] = Budget("default", usd_per_hour=Decimal(2))  # config lowered
        report = svc.reconciler.run_pass()
        assert report.expired == 2
        assert [svc.store.get_lease(l.lease_id).state for l in leases] == ["running", "released", "released"]
        assert set(live_by_lease(clouds)) == {leases[0].lease_id}
