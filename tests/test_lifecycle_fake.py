"""The lifecycle, the reconciler and failover against in-memory clouds (tests/fake_provider.py):
the same code paths as the SDK-level tests, in milliseconds, so every branch can be walked."""
from __future__ import annotations

import pytest

from broker.lease import LeaseState
from broker.lifecycle import LeaseError, Lifecycle, Settings
from broker.quote import QuoteEngine
from broker.reconciler import Reconciler
from broker.store import Store
from broker.records import Job
from policies.demand import Demand
from providers.base import AuthError, InstanceState, Market, ThrottledError, TransientError
from tests.fake_provider import FakeProvider
from tests.lease_kit import Clock, states
from tests.stores import db_url  # noqa: F401  (fixture)

S = LeaseState


@pytest.fixture
def kit(tmp_path, mini_catalog):
    clock = Clock(1_800_000_000.0)
    clouds = {name: FakeProvider(name, clock=clock) for name in ("aws", "gcp", "azure")}
    store = Store(f"sqlite:///{tmp_path / 'broker.db'}")
    lc = Lifecycle(store, clouds, QuoteEngine(mini_catalog), owner="test", clock=clock,
                   settings=Settings(backoff_s=0.0), sleep=lambda s: None)
    rec = Reconciler(lc, orphan_grace_s=60.0, clock=clock)
    yield lc, rec, clouds, clock
    store.close()


def h100(lc, provider="aws", region="us-east-1", itype="p5.48xlarge", market="on_demand", count=1):
    return lc.target_explicit(provider, region, "", itype, market, count)


def quoted(lc, gpus=8, interruptible=False):
    """A target and its ranked alternatives, as a quote would hand them over."""
    q = lc.engine.quote(Demand(gpus=gpus, hours=1, gpu_model="H100", interruptible=interruptible))
    targets = [lc.target_explicit(r.offering.provider, r.offering.region, r.priced.zone, r.offering.instance.name,
                                  r.offering.market.value, r.priced.nodes) for r in q.offers]
    return q.demand, targets


def test_launch_and_release_walk_the_table(kit):
    lc, _, clouds, _ = kit
    lease = lc.launch(idempotency_key="k", target=h100(lc, count=2))
    assert lease.state is S.RUNNING and len(lease.instances) == 2
    assert {i.instance_id for i in clouds["aws"].alive()} == lease.instance_ids
    done = lc.release(lease.lease_id, "done")
    assert done.state is S.RELEASED and clouds["aws"].alive() == []
    assert states(lc.store, lease.lease_id) == ["requested", "provisioning", "running", "draining", "released"]
    assert lc.release(lease.lease_id).version == done.version  # repeating it changes nothing


def test_capacity_fails_over_to_the_next_cloud_and_blocks_the_zone(kit):
    lc, _, clouds, _ = kit
    demand, targets = quoted(lc)
    first = targets[0]
    clouds[first.provider].capacity[(first.region, first.instance_type)] = 0
    lease = lc.launch(idempotency_key="k", target=first, demand=demand, alternatives=targets[1:])
    assert lease.state is S.RUNNING and (lease.provider, lease.region) != (first.provider, first.region)
    a = lease.attempts[0]
    assert (a.provider, a.code, a.kind) == (first.provider, "InsufficientCapacity", "capacity")
    # every zone of the full region was tried (or skipped as blocked) before leaving it
    assert all((b.provider, b.region) == (first.provider, first.region) for b in lease.attempts)
    assert any(k.startswith(f"{first.provider}/{first.region}") for k in lc.store.active_blocks(lc.clock()))


def test_throttling_retries_the_same_offer_with_a_fresh_token(kit):
    lc, _, clouds, _ = kit
    clouds["aws"].fail("launch", ThrottledError("slow down", provider="aws", code="RequestLimitExceeded",
                                                region="us-east-1"), times=2)
    lease = lc.launch(idempotency_key="k", target=h100(lc))
    assert lease.state is S.RUNNING and lease.provider == "aws" and lease.attempt == 3
    assert [s.client_token for m, s in clouds["aws"].calls if m == "launch"] == \
        [f"{lease.lease_id}-{n}" for n in (1, 2, 3)]


def test_an_auth_error_skips_the_rest_of_that_cloud_and_every_offer_failing_fails_the_lease(kit):
    lc, _, clouds, _ = kit
    for name in clouds:
        clouds[name].fail("launch", AuthError("no", provider=name, code="UnauthorizedOperation"), times=9)
    demand, targets = quoted(lc)
    with pytest.raises(LeaseError) as e:
        lc.launch(idempotency_key="k", target=targets[0], demand=demand, alternatives=targets[1:])
    lease = lc.store.lease_by_key("default", "k")
    assert lease.state is S.FAILED and lease.ended_at
    launched = [m for name in clouds for m, _ in clouds[name].calls if m == "launch"]
    assert len(launched) == len({t.provider for t in targets})  # one try per cloud, then skipped
    assert {a.code for a in e.value.attempts} == {"UnauthorizedOperation", "blocked"}


def test_the_reconciler_adopts_a_launch_that_finished_while_the_broker_was_down(kit):
    lc, rec, clouds, clock = kit
    lease, _ = lc.create(idempotency_key="k", target=h100(lc, count=2))
    lease = lc._begin_attempt(lease, h100(lc, count=2), [])  # the process died right after its cloud call
    clouds["aws"].launch(lc.spec_for(lease))
    report = rec.run_pass()
    assert report.adopted == 1
    after = lc.get(lease.lease_id)
    assert after.state is S.RUNNING and after.instance_ids == {i.instance_id for i in clouds["aws"].alive()}


def test_a_launch_abandoned_mid_call_is_resumed_with_its_own_token(kit):
    lc, rec, clouds, clock = kit
    lease, _ = lc.create(idempotency_key="k", target=h100(lc))
    lease = lc._begin_attempt(lease, h100(lc), [])
    clock.advance(lc.settings.resume_after_s)
    assert rec.run_pass().resumed == 1
    after = lc.get(lease.lease_id)
    assert after.state is S.RUNNING and after.client_token == lease.client_token
    assert states(lc.store, lease.lease_id)[-3:] == ["requested", "provisioning", "running"]


def test_orphans_are_reaped_after_the_grace_period_and_a_stranger_lease_kept(kit):
    lc, rec, clouds, clock = kit
    mine = lc.launch(idempotency_key="k", target=h100(lc))
    orphan = clouds["gcp"].plant("l-gone", "us-central1", "a3-highgpu-8g", Market.ON_DEMAND)
    assert rec.run_pass().orphans_terminated == 0  # first seen
    clock.advance(61)
    assert rec.run_pass().orphans_terminated == 1
    assert orphan.instance_id not in clouds["gcp"].instances
    assert lc.get(mine.lease_id).state is S.RUNNING and len(clouds["aws"].alive()) == 1


def test_a_spot_interruption_drains_requeues_and_asks_for_a_replacement(kit):
    lc, rec, clouds, _ = kit
    demand, targets = quoted(lc, interruptible=True)
    spot = [t for t in targets if t.market is Market.SPOT]
    lease = lc.launch(idempotency_key="k", target=spot[0], demand=demand, alternatives=spot[1:],
                      job=Job(job_id="train-1", checkpoint_uri="s3://ck/1"))
    (inst,) = [i for i in clouds[lease.provider].alive()]
    clouds[lease.provider].interrupt(inst.instance_id)
    report = rec.run_pass()
    assert report.interrupted == 1 and report.replaced == 1
    old = lc.get(lease.lease_id)
    assert old.state is S.RELEASED  # drained in the same pass (nothing left in the cloud)
    kinds = [e.kind for e in lc.store.events_of(lease.lease_id)]
    assert "interrupted" in kinds and "requeue" in kinds
    (new,) = [l for l in lc.store.list_leases() if l.replaces == lease.lease_id]
    assert new.job.checkpoint_uri == "s3://ck/1" and new.state is S.RUNNING
    assert (new.provider, new.region, new.instance_type) != (old.provider, old.region, old.instance_type) \
        or new.market != old.market


def test_lost_instances_drain_a_running_lease(kit):
    lc, rec, clouds, _ = kit
    lease = lc.launch(idempotency_key="k", target=h100(lc, count=2))
    clouds["aws"].vanish(sorted(lease.instance_ids)[0])
    rec.run_pass()
    after = lc.get(lease.lease_id)
    assert after.state is S.RELEASED and after.state_reason.startswith("instances lost")
    assert clouds["aws"].alive() == []


def test_a_provider_whose_listing_fails_is_skipped_not_concluded_from(kit):
    lc, rec, clouds, _ = kit
    lease = lc.launch(idempotency_key="k", target=h100(lc))
    clouds["aws"].fail("list_managed", TransientError("503", provider="aws", code="ServiceUnavailable"))
    report = rec.run_pass()
    assert report.skipped_providers == ["aws"] and lc.get(lease.lease_id).state is S.RUNNING
    assert all(i.state is InstanceState.RUNNING for i in clouds["aws"].alive())


def test_spend_past_2_to_the_31_micro_dollars_accrues_and_releases(db_url, mini_catalog):  # noqa: F811
    """$2,147.48 is 2^31 micro-dollars: one p5.48xlarge node passes it in under a day. Every money
    and counter column is 64-bit, so the lease accrues, reconciles and releases on both stores."""
    clock = Clock(1_800_000_000.0)
    aws = FakeProvider("aws", clock=clock)
    store = Store(db_url)
    try:
        lc = Lifecycle(store, {"aws": aws}, QuoteEngine(mini_catalog), owner="test", clock=clock)
        rec = Reconciler(lc, clock=clock)
        lease = lc.launch(idempotency_key="big", target=h100(lc, count=2), job=Job(job_id="j0"))  # busy: not idle
        clock.advance(30 * 3600)  # 2 x $98.32/h x 30 h = $5,899.20
        rec.run_pass()
        lc.handoff(lease.lease_id, Job(job_id="j"))  # a write while the accrual is past 2^31 in view
        clock.advance(3600)
        done = lc.release(lease.lease_id, "done")
        assert done.state is S.RELEASED and aws.alive() == []
        assert done.accrued_micros == 2 * 98_320_000 * 31 > 2**31
        assert store.get_lease(lease.lease_id).accrued_micros == done.accrued_micros
    finally:
        store.close()


def test_named_capacity_keeps_its_failover_alternatives(kit):
    """A launch on named capacity (no demand) with alternatives stores them and fails over to
    them when the named offer has no capacity."""
    lc, _, clouds, _ = kit
    first, other = h100(lc, "aws"), h100(lc, "gcp", "us-central1", "a3-highgpu-8g")
    clouds["aws"].capacity[(first.region, first.instance_type)] = 0
    created, _ = lc.create(idempotency_key="named", target=first, alternatives=[other])
    assert created.demand is None and created.alternatives == (other,)
    assert lc.get(created.lease_id).alternatives == (other,)  # as stored
    lease = lc.provision(created)
    assert lease.state is S.RUNNING and (lease.provider, lease.instance_type) == ("gcp", "a3-highgpu-8g")
    assert lease.attempts[0].provider == "aws" and lease.attempts[0].kind == "capacity"
