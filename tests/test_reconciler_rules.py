"""The reconciler's teardown and recovery rules at their edges, on clouds in memory
(tests/fake_provider.py) and a clock the test moves: idle and lifetime limits, a job that ended,
a launch abandoned between the cloud's answer and its record, launches that time out, leftovers
of earlier attempts, and a unit of a pass that fails without stopping the others."""
from __future__ import annotations

import json

import pytest

from broker.lease import LeaseState
from broker.lifecycle import Lifecycle, Settings
from broker.quote import QuoteEngine
from broker.reconciler import Reconciler, _attempt_of, loss_cause
from broker.records import Job
from broker.store import Store
from providers.base import Instance, InstanceState, Market, StopReason, TransientError
from tests.fake_provider import FakeProvider
from tests.lease_kit import Clock, states

S = LeaseState
T0 = 1_800_000_000.0
GRACE_S = 60.0


def _kit(tmp_path, catalog, **settings):
    clock = Clock(T0)
    clouds = {name: FakeProvider(name, clock=clock) for name in ("aws", "gcp", "azure")}
    store = Store(f"sqlite:///{tmp_path / 'broker.db'}")
    lc = Lifecycle(store, clouds, QuoteEngine(catalog), owner="test", clock=clock,
                   settings=Settings(backoff_s=0.0, **settings), sleep=lambda s: None)
    errors: list[tuple[str, str]] = []
    rec = Reconciler(lc, orphan_grace_s=GRACE_S, clock=clock, on_error=lambda *a: errors.append(a))
    return lc, rec, clouds, clock, store, errors


@pytest.fixture
def kit(tmp_path, mini_catalog):
    lc, rec, clouds, clock, store, errors = _kit(tmp_path, mini_catalog)
    yield lc, rec, clouds, clock
    store.close()


def h100(lc, count=1):
    return lc.target_explicit("aws", "us-east-1", "", "p5.48xlarge", "on_demand", count)


# -- idle, lifetime, a job that ended ------------------------------------------------------------------
def test_an_idle_lease_is_released_at_exactly_idle_timeout_s(kit):
    lc, rec, clouds, clock = kit
    lease = lc.launch(idempotency_key="k", target=h100(lc))
    assert lease.idle_since == T0
    clock.advance(lc.settings.idle_timeout_s - 1)
    assert rec.run_pass().expired == 0 and lc.get(lease.lease_id).state is S.RUNNING
    clock.advance(1)
    assert rec.run_pass().expired == 1
    done = lc.get(lease.lease_id)
    assert done.state is S.RELEASED and done.state_reason == "idle for 3600 s with no job"
    assert clouds["aws"].alive() == []


def test_a_busy_lease_is_not_idle(kit):
    lc, rec, _, clock = kit
    lease = lc.launch(idempotency_key="k", target=h100(lc), job=Job(job_id="j"))
    clock.advance(lc.settings.idle_timeout_s * 2)
    assert rec.run_pass().expired == 0 and lc.get(lease.lease_id).state is S.RUNNING


def test_an_idle_lease_reaching_its_lifetime_is_released_at_exactly_the_limit(tmp_path, mini_catalog):
    lc, rec, clouds, clock, store, _ = _kit(tmp_path, mini_catalog, idle_timeout_s=0)
    try:
        lease = lc.launch(idempotency_key="k", target=h100(lc), max_lifetime_s=1000)
        assert lease.max_lifetime_s == 1000
        clock.advance(999)
        assert rec.run_pass().expired == 0
        clock.advance(1)
        assert rec.run_pass().expired == 1
        done = lc.get(lease.lease_id)
        assert done.state is S.RELEASED and done.state_reason == "maximum lifetime of 1000 s reached"
    finally:
        store.close()


def test_a_running_job_is_warned_before_its_lease_ends_then_requeued(tmp_path, mini_catalog):
    lc, rec, clouds, clock, store, _ = _kit(tmp_path, mini_catalog, lifetime_warning_s=100)
    try:
        lease = lc.launch(idempotency_key="k", target=h100(lc), max_lifetime_s=1000, job=Job(job_id="j"))
        clock.advance(899)
        rec.run_pass()
        assert not lc.get(lease.lease_id).job.lifetime_warned
        clock.advance(1)  # exactly lifetime_warning_s before the end
        rec.run_pass()
        warned = lc.get(lease.lease_id)
        assert warned.job.lifetime_warned and warned.job.checkpoint_requested and warned.state is S.RUNNING
        (ev,) = [e for e in store.events_of(lease.lease_id) if e.kind == "lifetime_warning"]
        assert ev.message == ("job j: the lease reaches its maximum lifetime of 1000 s in 100 s; "
                              "checkpoint now")
        assert (ev.at, json.loads(ev.data)) == (clock(), {"job_id": "j"})
        clock.advance(50)
        rec.run_pass()  # warned once
        assert len([e for e in store.events_of(lease.lease_id) if e.kind == "lifetime_warning"]) == 1
        clock.advance(50)
        report = rec.run_pass()
        assert report.expired == 1 and report.replaced == 1
        old = lc.get(lease.lease_id)
        (new,) = [l for l in store.list_leases() if l.replaces == lease.lease_id]
        assert old.state is S.RELEASED and old.state_reason == (
            "maximum lifetime: maximum lifetime of 1000 s reached with job j running; "
            f"replacement lease {new.lease_id} requested")
        assert new.job.job_id == "j"
    finally:
        store.close()


def test_a_running_job_at_the_limit_extends_the_lease_when_so_configured(tmp_path, mini_catalog):
    lc, rec, clouds, clock, store, _ = _kit(tmp_path, mini_catalog, lifetime_warning_s=100,
                                            lifetime_with_job="extend", max_lifetime_s=500)
    try:
        lease = lc.launch(idempotency_key="k", target=h100(lc), max_lifetime_s=1000, job=Job(job_id="j"))
        clock.advance(900)
        rec.run_pass()
        clock.advance(100)
        report = rec.run_pass()
        assert report.expired == 0
        more = lc.get(lease.lease_id)
        assert more.state is S.RUNNING and more.max_lifetime_s == 1500
        assert not more.job.lifetime_warned and not more.job.checkpoint_requested
        (ev,) = [e for e in store.events_of(lease.lease_id) if e.kind == "lifetime_extended"]
        assert ev.message == "maximum lifetime of 1000 s reached with job j running: extended by 500 s"
        assert ev.at == clock()
        assert clouds["aws"].alive() != []
    finally:
        store.close()


@pytest.mark.parametrize("state, code, why", [
    ("succeeded", 0, "job j succeeded (exit code 0)"),
    ("failed", None, "job j failed"),
    ("cancelled", 3, "job j cancelled (exit code 3)"),
])
def test_a_lease_whose_job_ended_is_released_in_the_next_pass(kit, state, code, why):
    lc, rec, clouds, clock = kit
    lease = lc.launch(idempotency_key="k", target=h100(lc), job=Job(job_id="j"))
    lc.store.update_lease(lease, now=clock(), job=lease.job.with_(state=state, exit_code=code), job_state=state)
    assert rec.run_pass().expired == 1
    done = lc.get(lease.lease_id)
    assert done.state is S.RELEASED and done.state_reason == why
    assert clouds["aws"].alive() == []


# -- a launch between the cloud's answer and its record ------------------------------------------------
def _crashed_after_launch(lc, clouds, count=2):
    """A lease whose launch reached the cloud and whose process died before recording it."""
    lease, _ = lc.create(idempotency_key="k", target=h100(lc, count))
    lease = lc._begin_attempt(lease, h100(lc, count), [])
    made = clouds["aws"].launch(lc.spec_for(lease))
    return lease, made


def test_a_launch_whose_nodes_are_all_up_is_adopted_as_it_was(kit):
    lc, rec, clouds, clock = kit
    lease, made = _crashed_after_launch(lc, clouds)
    report = rec.run_pass()
    assert report.adopted == 1 and report.resumed == 0
    after = lc.get(lease.lease_id)
    assert after.state is S.RUNNING and after.instance_ids == {i.instance_id for i in made}
    assert after.attempt == 1 and after.started_at == clock() and after.idle_since == clock()
    assert states(lc.store, lease.lease_id) == ["requested", "provisioning", "running"]


def test_a_launch_with_a_node_missing_is_not_adopted_but_resumed_with_its_token(kit):
    lc, rec, clouds, clock = kit
    lease, made = _crashed_after_launch(lc, clouds)
    clouds["aws"].vanish(made[0].instance_id)
    assert rec.run_pass().adopted == 0 and lc.get(lease.lease_id).state is S.PROVISIONING
    clock.advance(lc.settings.resume_after_s - 1)
    assert rec.run_pass().resumed == 0
    clock.advance(1)
    assert rec.run_pass().resumed == 1
    after = lc.get(lease.lease_id)
    # the same token first: the cloud answers with what that call made (the one node left), a partial
    # gang, given back; the next attempt, with a token of its own, makes the whole gang
    launches = [spec.client_token for m, spec in clouds["aws"].calls if m == "launch"]
    assert launches == [lease.client_token, lease.client_token, f"{lease.lease_id}-2"]
    assert after.state is S.RUNNING and after.client_token == f"{lease.lease_id}-2" and len(after.instances) == 2
    assert made[1].instance_id not in clouds["aws"].instances
    assert {i.instance_id for i in clouds["aws"].alive()} == after.instance_ids


def test_a_launch_being_made_by_this_process_is_left_to_it(kit):
    lc, rec, clouds, clock = kit
    lease, _ = _crashed_after_launch(lc, clouds)
    lc.inflight.add(lease.lease_id)
    clock.advance(lc.settings.resume_after_s)
    report = rec.run_pass()
    assert (report.adopted, report.resumed) == (0, 0) and lc.get(lease.lease_id).state is S.PROVISIONING


def test_an_earlier_attempts_nodes_are_not_adopted(kit):
    lc, rec, clouds, clock = kit
    lease, made = _crashed_after_launch(lc, clouds, count=1)
    lease = lc._begin_attempt(lease, h100(lc), [])  # attempt 2 started; its call never reached the cloud
    assert not _attempt_of(made[0], lease)
    assert rec.run_pass().adopted == 0 and lc.get(lease.lease_id).state is S.PROVISIONING


def test_a_node_is_of_the_current_attempt_by_its_shape_and_name(kit):
    lc, _, clouds, _ = kit
    lease, (node,) = _crashed_after_launch(lc, clouds, count=1)
    assert _attempt_of(node, lease)
    for other in (dict(instance_type="p4d.24xlarge"), dict(region="us-west-2"), dict(market=Market.SPOT),
                  dict(node_name="x-1-0")):
        assert not _attempt_of(_with(node, **other), lease), other
    assert _attempt_of(_with(node, node_name=""), lease)  # not named yet: its shape decides


def _with(i: Instance, **kw) -> Instance:
    import dataclasses
    return dataclasses.replace(i, **kw)


def test_a_launch_that_never_finishes_is_failed_at_exactly_provision_timeout_s(kit):
    lc, rec, clouds, clock = kit
    lease, _ = lc.create(idempotency_key="k", target=h100(lc))
    lease = lc._begin_attempt(lease, h100(lc), [])
    lc.inflight.add(lease.lease_id)  # stuck in this process: never resumed
    clock.advance(lc.settings.provision_timeout_s - 1)
    assert rec.run_pass().failed == 0 and lc.get(lease.lease_id).state is S.PROVISIONING
    clock.advance(1)
    assert rec.run_pass().failed == 1
    done = lc.get(lease.lease_id)
    assert done.state is S.RELEASED and done.state_reason == "launch did not finish within 900 s"


def test_a_launch_on_a_cloud_that_could_not_be_listed_is_not_timed_out(kit):
    lc, rec, clouds, clock = kit
    lease, _ = lc.create(idempotency_key="k", target=h100(lc))
    lease = lc._begin_attempt(lease, h100(lc), [])
    clock.advance(lc.settings.provision_timeout_s)
    clouds["aws"].fail("list_managed", TransientError("503", provider="aws", code="ServiceUnavailable"))
    report = rec.run_pass()
    assert report.skipped_providers == ["aws"] and report.failed == 0 and report.resumed == 0
    assert lc.get(lease.lease_id).state is S.PROVISIONING


def test_a_request_left_by_a_crash_is_launched_after_five_seconds(kit):
    lc, rec, clouds, clock = kit
    lease, _ = lc.create(idempotency_key="k", target=h100(lc))
    clock.advance(4.9)
    assert rec.run_pass().resumed == 0
    clock.advance(0.1)
    assert rec.run_pass().resumed == 1 and lc.get(lease.lease_id).state is S.RUNNING


def test_a_replacement_is_launched_at_once(kit):
    lc, rec, clouds, clock = kit
    lease, _ = lc.create(idempotency_key="k", target=h100(lc), replaces="l-old")
    assert rec.run_pass().resumed == 1 and lc.get(lease.lease_id).state is S.RUNNING


def test_a_request_that_cannot_launch_is_counted_failed(kit):
    lc, rec, clouds, clock = kit
    clouds["aws"].capacity[("us-east-1", "p5.48xlarge")] = 0
    lease, _ = lc.create(idempotency_key="k", target=h100(lc), replaces="l-old")
    report = rec.run_pass()
    assert (report.resumed, report.failed) == (1, 1) and lc.get(lease.lease_id).state is S.FAILED


def test_a_draining_lease_is_finished_and_one_with_nothing_left_released_in_sync(kit):
    lc, rec, clouds, clock = kit
    a = lc.drain(lc.launch(idempotency_key="a", target=h100(lc)), "going")
    b = lc.launch(idempotency_key="b", target=h100(lc))
    clouds["aws"].terminate([i for i in clouds["aws"].alive() if i.lease_id == b.lease_id])
    b = lc.drain(lc.get(b.lease_id), "going")
    report = rec.run_pass()
    assert report.released == 2
    assert lc.get(a.lease_id).state is S.RELEASED and lc.get(b.lease_id).state is S.RELEASED
    assert clouds["aws"].alive() == []


# -- orphans and errors ---------------------------------------------------------------------------------------
def test_a_draining_or_launching_leases_nodes_are_not_orphans(kit):
    lc, rec, clouds, clock = kit
    lease, made = _crashed_after_launch(lc, clouds, count=1)
    lc.inflight.add(lease.lease_id)
    clock.advance(GRACE_S)
    rec.run_pass()
    clock.advance(GRACE_S)
    assert rec.run_pass().orphans_terminated == 0 and made[0].instance_id in clouds["aws"].instances


def test_an_orphan_terminate_that_fails_is_counted_and_the_pass_goes_on(tmp_path, mini_catalog):
    lc, rec, clouds, clock, store, errors = _kit(tmp_path, mini_catalog)
    try:
        lease = lc.launch(idempotency_key="k", target=h100(lc), job=Job(job_id="j"))
        clouds["gcp"].plant("l-gone", "us-central1", "a3-highgpu-8g", Market.ON_DEMAND)
        rec.run_pass()
        clock.advance(GRACE_S)
        clouds["gcp"].fail("terminate", TransientError("503", provider="gcp", code="ServiceUnavailable"))
        lc.store.update_lease(lease, now=clock(), job=lease.job.with_(state="succeeded"), job_state="succeeded")
        report = rec.run_pass()
        assert report.errors == 1 and report.orphans_terminated == 0 and errors == [("orphans", "gcp")]
        assert report.expired == 1 and lc.get(lease.lease_id).state is S.RELEASED
        clock.advance(1)
        assert rec.run_pass().orphans_terminated == 1  # still past its grace: next pass
    finally:
        store.close()


def test_a_lost_leases_cause_follows_why_the_cloud_stopped_it():
    def stopped(reason):
        return Instance("aws", "i-1", "us-east-1", "us-east-1a", "p5.48xlarge", Market.ON_DEMAND,
                        InstanceState.TERMINATED, "l-1", "", "", stop_reason=reason)

    assert loss_cause([stopped(StopReason.USER), stopped(StopReason.ERROR)]) == "outside termination"
    assert loss_cause([stopped(StopReason.ERROR)]) == "host failure"
    assert loss_cause([stopped(StopReason.CAPACITY)]) == "host failure"
    assert loss_cause([stopped(StopReason.INTERRUPTED)]) == "lost instance"
    assert loss_cause([]) == "lost instance"
