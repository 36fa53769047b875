"""The lifecycle, the reconciler and failover against in-memory clouds (tests/fake_provider.py):
the same code paths as the SDK-level tests, in milliseconds, so every branch can be walked."""
from __future__ import annotations

import dataclasses
import json
from decimal import Decimal

import pytest
from structlog.testing import capture_logs

from broker.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable
from broker.lease import EventKind, LeaseState
from broker.lifecycle import LeaseError, Lifecycle, Settings, lease_view
from broker.quote import QuoteEngine, StoredQuote
from broker.reconciler import Reconciler
from broker.store import Store
from broker.records import Job
from broker.targets import Target
from policies.demand import Demand
from providers.base import (AuthError, CapacityError, InstanceState, Market, QuotaError, Scope, ThrottledError,
                            TransientError)
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
        rec = Reconciler(lc, orphan_grace_s=120.0, clock=clock)
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


# -- what a failed offer blocks ----------------------------------------------------------------------
ZONED = ("aws", "us-east-1", "us-east-1a", "p5.48xlarge", "on_demand", 1)


@pytest.mark.parametrize("error, key", [
    # a capacity error naming its region blocks its own scope
    (CapacityError("x", provider="aws", code="InsufficientCapacity", region="us-east-1", zone="us-east-1a"),
     "aws/us-east-1/us-east-1a"),
    (CapacityError("x", provider="aws", code="InsufficientCapacity", region="us-east-1", scope=Scope.REGION),
     "aws/us-east-1"),
    # one that names no region: the target's zone, else its region
    (CapacityError("x", provider="aws", code="InsufficientCapacity"), "aws/us-east-1/us-east-1a"),
    (CapacityError("x", provider="aws", code="InsufficientCapacity", scope=Scope.REGION), "aws/us-east-1"),
    (QuotaError("x", provider="aws", code="", region="us-east-1"), "aws/us-east-1"),
    # an offer's scope: that instance type and market in that region only
    (CapacityError("x", provider="aws", code="Unsupported", region="us-east-1", scope=Scope.OFFER),
     "aws/us-east-1/p5.48xlarge/on_demand"),
])
def test_a_capacity_or_quota_error_blocks_its_scope_for_block_s(kit, error, key):
    lc, _, _, clock = kit
    t = lc.target_explicit(*ZONED)
    assert lc._block_for(error, t) == key
    why = f"{error.code or type(error).__name__} on {key}"
    assert lc.store.active_blocks(clock() + lc.settings.block_s - 1) == {key: why}
    assert lc.store.active_blocks(clock() + lc.settings.block_s) == {}
    assert lc._blocked_reason(t) == (key, f"blocked: {why}")


def test_a_zone_scoped_error_without_a_zone_blocks_the_region(kit):
    lc, _, _, _ = kit
    t = dataclasses.replace(lc.target_explicit(*ZONED), zone="")  # the cloud picks the zone
    assert lc._block_for(CapacityError("x", provider="aws", code="C"), t) == "aws/us-east-1"


def test_throttling_and_faults_block_nothing(kit):
    lc, _, _, clock = kit
    t = lc.target_explicit(*ZONED)
    assert lc._block_for(ThrottledError("x", provider="aws", code="Throttling", region="us-east-1"), t) == ""
    assert lc._block_for(AuthError("x", provider="aws", code="AuthFailure", region="us-east-1"), t) == ""
    assert lc.store.active_blocks(clock()) == {}


def test_a_quota_error_refreshes_the_quota_and_blocks_only_the_offering(kit):
    lc, _, _, clock = kit
    seen = []
    lc.on_quota_error = lambda provider, region: seen.append((provider, region))
    t = lc.target_explicit(*ZONED)
    key = lc._block_for(QuotaError("x", provider="aws", code="VcpuLimitExceeded", region="us-east-1"), t)
    assert key == "aws/us-east-1/p5.48xlarge/on_demand" and seen == [("aws", "us-east-1")]
    assert lc.store.active_blocks(clock()) == {key: f"VcpuLimitExceeded on {key}"}
    # a capacity error is not a quota error: no refresh
    lc._block_for(CapacityError("x", provider="aws", code="C", region="us-east-1"), t)
    assert seen == [("aws", "us-east-1")]


def test_the_failed_attempt_names_what_it_blocked(kit):
    lc, _, clouds, _ = kit
    clouds["aws"].capacity[("us-east-1", "p5.48xlarge")] = 0
    with pytest.raises(LeaseError):
        lc.launch(idempotency_key="k", target=lc.target_explicit(*ZONED))
    lease = lc.store.lease_by_key("default", "k")
    (a,) = [a for a in lease.attempts if a.zone == "us-east-1a" and a.kind != "blocked"]
    assert a.scope == "aws/us-east-1/us-east-1a"


# -- what a failed or retried attempt leaves behind -----------------------------------------------------
def test_a_failed_attempts_leftovers_are_terminated_and_logged(kit):
    lc, _, clouds, _ = kit
    aws = clouds["aws"]
    made = []

    def made_then_refused(spec):
        made.extend(FakeProvider.launch(aws, spec))
        raise CapacityError("rolled back late", provider="aws", code="InsufficientCapacity", region=spec.region,
                            zone=spec.zone)

    aws._failures["launch"].append(made_then_refused)
    with capture_logs() as logs:
        lease = lc.launch(idempotency_key="k", target=h100(lc))
    assert lease.state is S.RUNNING and lease.instance_ids == {i.instance_id for i in aws.alive()}
    assert made and not {i.instance_id for i in made} & set(aws.instances)
    (left,) = [e for e in logs if e["event"] == "attempt_leftovers"]
    assert left == {"event": "attempt_leftovers", "log_level": "warning", "lease": lease.lease_id,
                    "provider": "aws", "region": "us-east-1", "instances": [i.instance_id for i in made]}


def test_a_retry_keeps_its_own_nodes_and_gives_back_what_a_timed_out_call_made(kit):
    lc, _, clouds, _ = kit
    aws = clouds["aws"]
    first = []

    def made_then_timed_out(spec):
        first.extend(FakeProvider.launch(aws, spec))
        raise TransientError("read timeout", provider="aws", code="RequestTimeout", region=spec.region)

    aws._failures["launch"].append(made_then_timed_out)
    lease = lc.launch(idempotency_key="k", target=h100(lc))
    assert lease.state is S.RUNNING and lease.attempt == 2
    assert lease.instance_ids == {i.instance_id for i in aws.alive()}
    assert first and not {i.instance_id for i in first} & set(aws.instances)


def test_a_cleanup_that_fails_is_logged_and_the_launch_goes_on(kit):
    lc, _, clouds, _ = kit
    aws = clouds["aws"]
    aws.capacity[("us-east-1", "p5.48xlarge")] = 0
    err = TransientError("503 " * 200, provider="aws", code="ServiceUnavailable")
    aws.fail("describe", err)
    with capture_logs() as logs:
        lease = lc.launch(idempotency_key="k", target=h100(lc),
                          alternatives=[h100(lc, "gcp", "us-central1", "a3-highgpu-8g")],
                          demand=Demand(gpus=8, hours=1, gpu_model="H100"))
    assert lease.state is S.RUNNING and lease.provider == "gcp"
    (e,) = [e for e in logs if e["event"] == "attempt_cleanup_failed"]
    assert e == {"event": "attempt_cleanup_failed", "log_level": "warning", "lease": lease.lease_id,
                 "provider": "aws", "code": "ServiceUnavailable", "error": str(err)[:500]}


def test_a_lease_that_fails_everywhere_says_so_in_at_most_2000_characters(tmp_path, mini_catalog):
    clock = Clock(1_800_000_000.0)
    aws = FakeProvider("aws", clock=clock)
    store = Store(f"sqlite:///{tmp_path / 'broker.db'}")
    try:
        lc = Lifecycle(store, {"aws": aws}, QuoteEngine(mini_catalog), owner="test", clock=clock,
                       settings=Settings(backoff_s=0.0, retries=20), sleep=lambda s: None)
        calls = iter(range(1000))

        def throttled(spec):  # each refusal says something else: the summary cannot fold them
            raise ThrottledError(f"slow down, call {next(calls)} " * 5, provider="aws", code="Throttling")

        aws.fail("launch", throttled, times=1000)
        with pytest.raises(LeaseError):
            lc.launch(idempotency_key="k", target=h100(lc))
        lease = store.lease_by_key("default", "k")
        assert lease.state is S.FAILED and len(lease.attempts) >= 20
        assert lease.state_reason.startswith("every offer failed: Throttling") and len(lease.state_reason) == 2000
    finally:
        store.close()


# -- named transitions -----------------------------------------------------------------------------------
def test_resume_steps_a_launch_back_to_requested_to_repeat_its_attempt(kit):
    lc, _, _, _ = kit
    lease, _ = lc.create(idempotency_key="k", target=h100(lc))
    lease = lc._begin_attempt(lease, h100(lc), [])
    assert (lease.state, lease.attempt, lease.client_token) == (S.PROVISIONING, 1, f"{lease.lease_id}-1")
    back = lc.resume(lease)
    assert (back.state, back.attempt, back.state_reason) == (S.REQUESTED, 0, "resuming launch after restart")
    again = lc._begin_attempt(back, h100(lc), [])
    assert again.client_token == lease.client_token
    assert lc.resume(again, "why").state_reason == "why"


def test_drain_writes_its_events_and_fields_with_the_state(kit):
    lc, _, _, clock = kit
    lease = lc.launch(idempotency_key="k", target=h100(lc), job=Job(job_id="j"))
    clock.advance(3600)
    out = lc.drain(lease, "taken back", event_kind=EventKind.INTERRUPTED, event_data={"why": "spot"},
                   events=[(EventKind.REQUEUE, "job j requeued", {"job_id": "j"})], replaces="l-x")
    assert out.state is S.DRAINING and out.state_reason == "taken back" and out.replaces == "l-x"
    assert out.accrued_micros == lease.hourly_micros and out.accrued_at == clock()
    evs = [(e.kind, e.message, json.loads(e.data)) for e in lc.store.events_of(lease.lease_id)][-3:]
    assert evs == [("state_changed", "taken back", {"why": "spot"}), ("interrupted", "taken back", {"why": "spot"}),
                   ("requeue", "job j requeued", {"job_id": "j"})]


def test_a_released_lease_keeps_why_it_drained_and_its_nodes_are_terminated(kit):
    lc, _, clouds, clock = kit
    lease = lc.launch(idempotency_key="k", target=h100(lc, count=2))
    clock.advance(60)
    done = lc.release(lease.lease_id, "budget", event_kind=EventKind.BUDGET)
    assert done.state is S.RELEASED and done.state_reason == "budget" and done.ended_at == clock()
    assert {i.state for i in done.instances} == {InstanceState.TERMINATED} and len(done.instances) == 2
    kinds = [e.kind for e in lc.store.events_of(lease.lease_id)]
    assert kinds.count("budget") == 1
    assert lc.release(lease.lease_id).state_reason == "budget"  # repeating changes nothing


def test_a_lease_that_never_ran_is_released_at_no_cost(kit):
    lc, _, _, clock = kit
    lease, _ = lc.create(idempotency_key="k", target=h100(lc))
    lease = lc._begin_attempt(lease, h100(lc), [])
    clock.advance(3600)
    done = lc.release(lease.lease_id)
    assert done.state is S.RELEASED and done.state_reason == "released by request"
    assert (done.accrued_micros, done.accrued_at) == (0, 0.0)


def test_a_release_whose_terminate_fails_stays_draining_and_says_so(kit):
    lc, _, clouds, _ = kit
    lease = lc.launch(idempotency_key="k", target=h100(lc))
    clouds["aws"].fail("terminate", TransientError("503", provider="aws", code="ServiceUnavailable"))
    with pytest.raises(Unavailable) as e:
        lc.release(lease.lease_id)
    assert str(e.value).startswith(f"lease {lease.lease_id} is draining but ")
    assert str(e.value) == (f"lease {lease.lease_id} is draining but aws ServiceUnavailable (region aws): 503; "
                            "the reconciler keeps terminating it, or retry the release.")
    assert lc.get(lease.lease_id).state is S.DRAINING
    assert lc.release(lease.lease_id).state is S.RELEASED


def test_a_release_that_keeps_losing_the_race_gives_up_after_three_tries(kit):
    lc, _, clouds, clock = kit
    lease = lc.launch(idempotency_key="k", target=h100(lc))
    tries = []
    accrue = lc._accrue

    def racing(lease):  # someone else writes the lease between our read and our write, every time
        out = accrue(lease)
        tries.append(out.version)
        lc.store.update_lease(out, now=clock(), job_state=out.job_state)
        return out

    lc._accrue = racing
    with pytest.raises(Unavailable, match=f"lease {lease.lease_id} keeps changing; retry the release."):
        lc.release(lease.lease_id)
    assert len(tries) == 3


def test_a_release_that_loses_the_race_once_looks_again(kit):
    lc, _, clouds, clock = kit
    lease = lc.launch(idempotency_key="k", target=h100(lc))
    accrue, raced = lc._accrue, []

    def racing_once(lease):
        out = accrue(lease)
        if not raced:
            raced.append(out.version)
            lc.store.update_lease(out, now=clock(), job_state=out.job_state)
        return out

    lc._accrue = racing_once
    assert lc.release(lease.lease_id).state is S.RELEASED and raced


def test_a_hand_off_names_the_job_and_a_new_job_starts_its_own_record(kit):
    lc, _, _, clock = kit
    lease = lc.launch(idempotency_key="k", target=h100(lc), job=Job(job_id="j1", owner="ana", queue="gpu"))
    assert lease.idle_since == 0.0
    clock.advance(10)
    same = lc.handoff(lease.lease_id, Job(job_id="j1", checkpoint_uri="s3://ck"))
    assert (same.job.owner, same.job.queue, same.job.checkpoint_uri) == ("ana", "gpu", "s3://ck")
    assert same.job.attached_at == lease.job.attached_at
    clock.advance(10)
    new = lc.handoff(lease.lease_id, Job(job_id="j2"))
    assert new.job.job_id == "j2" and new.job.attached_at == clock() and new.job.state == "running"
    assert new.job_state == "running" and new.idle_since == 0.0 and new.job.owner == "ana"
    (ev, *_) = [e for e in reversed(lc.store.events_of(lease.lease_id)) if e.kind == "handoff"]
    assert ev.message == "job j2 handed off" and ev.to_state == "running"


def test_a_hand_off_to_an_idle_lease_makes_it_busy(kit):
    lc, _, _, clock = kit
    lease = lc.launch(idempotency_key="k", target=h100(lc))
    assert lease.idle_since == clock() and lease.job_state == ""
    busy = lc.handoff(lease.lease_id, Job(job_id="j"))
    assert busy.idle_since == 0.0 and busy.job_state == "running"


def test_a_hand_off_needs_a_running_lease_and_a_job_id(kit):
    lc, _, _, _ = kit
    lease, _ = lc.create(idempotency_key="k", target=h100(lc))
    with pytest.raises(FailedPrecondition, match=f"lease {lease.lease_id} is requested, not running"):
        lc.handoff(lease.lease_id, Job(job_id="j"))
    running = lc.provision(lease)
    with pytest.raises(InvalidArgument) as e:
        lc.handoff(running.lease_id, Job())
    assert str(e.value) == "job.job_id is required."


def test_a_hand_off_racing_another_write_is_applied_on_the_fresh_row(kit):
    lc, _, clouds, clock = kit
    lease = lc.launch(idempotency_key="k", target=h100(lc))
    stale = lc.get(lease.lease_id)
    lc.store.update_lease(stale, now=clock(), job_state=stale.job_state)  # bookkeeping meanwhile
    lc.get = lambda lease_id: stale  # the hand-off read the older row
    out = lc.handoff(lease.lease_id, Job(job_id="j"))
    assert out.job.job_id == "j" and out.version == stale.version + 2


def test_a_cleanup_that_raises_no_provider_error_is_logged_by_its_class(kit):
    lc, _, clouds, _ = kit
    aws = clouds["aws"]
    aws.capacity[("us-east-1", "p5.48xlarge")] = 0
    aws.fail("describe", RuntimeError("boom"))
    with capture_logs() as logs:
        with pytest.raises(LeaseError):
            lc.launch(idempotency_key="k", target=h100(lc))
    (e,) = [e for e in logs if e["event"] == "attempt_cleanup_failed"]
    assert (e["code"], e["error"]) == ("RuntimeError", "boom")


# -- what a caller names and is shown -----------------------------------------------------------------
LONG = "x" * 70  # a name is quoted back at most 64 characters long


@pytest.mark.parametrize("args, field, sentence", [
    ((LONG, "us-east-1", "", "p5.48xlarge", "on_demand", 1), "provider",
     f"provider {LONG[:64]!r} is not enabled (enabled: aws, azure, gcp)."),
    (("aws", "us-east-1", "", "p5.48xlarge", "cheap", 1), "market",
     "market must be on_demand, spot or reserved, got 'cheap'."),
    (("aws", "us-east-1", "", "p5.48xlarge", "on_demand", 0), "count", "count must be at least 1, got 0."),
    (("aws", "us-east-1", "", LONG, "on_demand", 1), "instance_type",
     f"instance_type {LONG[:64]!r} is not a known aws GPU type."),
    (("aws", LONG, "", "p5.48xlarge", "on_demand", 1), "region", f"region {LONG[:64]!r} is not a known aws region."),
    (("aws", "us-east-1", "", "p5.48xlarge", "reserved", 1), "market",
     "no configured reservation for aws us-east-1 p5.48xlarge."),
    (("aws", "eu-west-1", "", "p5.48xlarge", "spot", 1), "instance_type",
     "aws sells no spot p5.48xlarge in eu-west-1."),
    (("aws", "us-east-1", LONG, "p5.48xlarge", "on_demand", 1), "zone",
     f"zone {LONG[:64]!r} is not a zone of us-east-1 (us-east-1a, us-east-1b)."),
])
def test_an_offering_that_cannot_be_launched_is_refused_naming_its_field(kit, args, field, sentence):
    lc = kit[0]
    with pytest.raises(InvalidArgument) as e:
        lc.target_explicit(*args)
    assert (str(e.value), e.value.field) == (f"offering.{field}: {sentence}", f"offering.{field}")


def test_an_offering_of_no_enabled_cloud_says_none_is(kit):
    lc = kit[0]
    bare = Lifecycle(lc.store, {}, lc.engine, owner="test")
    with pytest.raises(InvalidArgument, match=r"^offering.provider: provider 'aws' is not enabled \(enabled: none\).$"):
        bare.target_explicit("aws", "us-east-1", "", "p5.48xlarge", "on_demand", 1)


def test_a_reserved_offering_is_launched_in_its_reservations_zone(kit, mini_catalog):
    lc = kit[0]
    on_demand = mini_catalog.find("aws", "us-east-1", "p5.48xlarge", Market.ON_DEMAND)
    held = dataclasses.replace(on_demand, market=Market.RESERVED, zones=("us-east-1b",), hourly_micros=60_000_000,
                               reservation="cr-1")
    lc.engine = QuoteEngine(mini_catalog.with_offerings((held,)))
    assert lc.target_explicit("aws", "us-east-1", "", "p5.48xlarge", "reserved", 2) == \
        Target("aws", "us-east-1", "us-east-1b", "p5.48xlarge", Market.RESERVED, 2, 60_000_000, "cr-1")
    with pytest.raises(InvalidArgument, match=r"zone 'us-east-1a' is not a zone of us-east-1 \(us-east-1b\)\.$"):
        lc.target_explicit("aws", "us-east-1", "us-east-1a", "p5.48xlarge", "reserved", 2)
    assert lc.target_explicit("aws", "us-east-1", "us-east-1b", "p5.48xlarge", "on_demand", 1) == \
        Target("aws", "us-east-1", "us-east-1b", "p5.48xlarge", Market.ON_DEMAND, 1, on_demand.hourly_micros)
    zoneless = dataclasses.replace(held, region="eu-west-1", zones=(), market=Market.SPOT, reservation="")
    lc.engine = QuoteEngine(mini_catalog.with_offerings((zoneless,)))  # a region whose zones the cloud keeps
    assert [lc.target_explicit("aws", "eu-west-1", z, "p5.48xlarge", "spot", 1).zone for z in ("", "eu-1z")] == \
        ["", "eu-1z"]


def test_a_quotes_offer_is_launched_with_the_others_as_its_alternatives(kit):
    lc, _, _, clock = kit
    demand, targets = quoted(lc)
    lc.store.save_quote(StoredQuote("q-1", clock(), clock() + 60, demand, tuple(targets[:3])))
    assert lc.target_from_quote("q-1", 2) == (targets[1], demand, [targets[0], targets[2]])
    clock.advance(61)  # the quote's validity is read on the lifecycle's clock
    with pytest.raises(InvalidArgument, match="quote q-1 expired at "):
        lc.target_from_quote("q-1", 1)
    with pytest.raises(NotFound) as e:
        lc.target_from_quote("q-nope", 1)
    assert (str(e.value), e.value.field) == ("quote q-nope does not exist.", "quote_offer.quote_id")


def test_a_lease_as_the_api_and_the_cli_show_it(kit):
    lc, _, clouds, clock = kit
    lease = lc.launch(idempotency_key="k", target=h100(lc, count=2), tenant="team-a", quote_id="q-1",
                      job=Job(job_id="j"), replaces="l-old")
    clock.advance(1800)
    made = sorted(clouds["aws"].alive(), key=lambda i: i.node_name)
    view = lease_view(lease, clock())
    view["instances"] = sorted(view["instances"], key=lambda i: i["node_name"])
    assert view == {
        "lease_id": lease.lease_id, "state": "running", "state_reason": "2 nodes running in aws/us-east-1a",
        "provider": "aws", "region": "us-east-1", "zone": "us-east-1a", "instance_type": "p5.48xlarge",
        "market": "on_demand", "nodes": 2, "hourly_usd": Decimal("196.6400"), "cost_so_far_usd": Decimal("98.3200"),
        "instances": [{"instance_id": i.instance_id, "node_name": f"{lease.lease_id}-1-{n}", "zone": "us-east-1a",
                       "private_ip": i.private_ip, "state": "running", "region": "us-east-1"}
                      for n, i in enumerate(made)],
        "idempotency_key": "k", "tenant": "team-a", "quote_id": "q-1", "job": {"job_id": "j"},
        "created_at": 1_800_000_000.0, "updated_at": 1_800_000_000.0, "replaces": "l-old", "attempts": (),
    }
