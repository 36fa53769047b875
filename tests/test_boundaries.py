"""Limits tested at their edge: a comparison turned from ``>=`` into ``>`` (or the reverse) must
fail a test. Each test puts the value exactly on the limit and just beside it.

Run against the in-memory clouds (tests/fake_provider.py), so each takes milliseconds."""
from __future__ import annotations

import dataclasses
import threading
from decimal import Decimal

import pytest
from structlog.testing import capture_logs

from broker import records
from broker.budget import Budgets
from broker.config import Budget
from broker.errors import InvalidArgument, NotFound, OverBudget

from broker.lease import LeaseState
from broker.lifecycle import LeaseError, Lifecycle, Settings
from broker.quote import QuoteEngine
from broker.records import Job
from broker.store import StaleLease, Store
from policies.demand import Demand
from providers.base import CapacityError, Market, Scope, TransientError
from tests.fake_provider import FakeProvider
from tests.lease_kit import Clock, lifecycle_kit

S = LeaseState

GRACE_S = 60.0
ZONED_AWS = ("aws", "us-east-1", "us-east-1a", "p5.48xlarge", "on_demand", 1)
SHAPE_SCOPE = "aws/us-east-1"  # a shape mismatch is retried, then fails the region
H100x8 = Demand(gpus=8, hours=1, gpu_model="H100")

# Four offers, each in its own region (no zone: the cloud picks one), all out of capacity.
OFFERS = [("aws", "us-east-1", "p5.48xlarge"), ("aws", "eu-west-1", "p5.48xlarge"),
          ("gcp", "us-central1", "a3-highgpu-8g"), ("gcp", "europe-west4", "a3-highgpu-8g")]


def _kit(tmp_path, catalog, **settings):
    return lifecycle_kit(tmp_path, catalog, grace_s=GRACE_S, **settings)


@pytest.fixture
def kit(tmp_path, mini_catalog):
    lc, rec, clouds, clock, store = _kit(tmp_path, mini_catalog)
    yield lc, rec, clouds, clock
    store.close()


def _launched(clouds) -> list[tuple[str, str]]:
    """The offers (zones aside: every zone of a region is the same offer) launched on, in order."""
    calls = [(name, spec.region) for name, c in clouds.items() for m, spec in c.calls if m == "launch"]
    return list(dict.fromkeys(calls))


@pytest.mark.parametrize("cap", [1, 2, 3])
def test_a_launch_tries_exactly_max_failover_offers(tmp_path, mini_catalog, cap):
    """max_failover = N: the N-th offer is tried (in each of its zones), the (N+1)-th is not."""
    lc, _, clouds, _, store = _kit(tmp_path, mini_catalog, max_failover=cap)
    try:
        for provider, region, itype in OFFERS:
            clouds[provider].capacity[(region, itype)] = 0
        first, *alts = [lc.target_explicit(p, r, "", t, "on_demand", 1) for p, r, t in OFFERS]
        with pytest.raises(LeaseError):
            lc.launch(idempotency_key="k", target=first, demand=H100x8, alternatives=alts)
        assert _launched(clouds) == [(p, r) for p, r, _ in OFFERS[:cap]]
        assert lc.store.lease_by_key("default", "k").state is LeaseState.FAILED
    finally:
        store.close()


def test_the_last_offer_within_max_failover_can_still_succeed(tmp_path, mini_catalog):
    """With max_failover = 2 and the first offer out of capacity, the second one runs."""
    lc, _, clouds, _, store = _kit(tmp_path, mini_catalog, max_failover=2)
    try:
        clouds["aws"].capacity[("us-east-1", "p5.48xlarge")] = 0
        first, second = [lc.target_explicit(p, r, "", t, "on_demand", 1) for p, r, t in OFFERS[:2]]
        lease = lc.launch(idempotency_key="k", target=first, demand=H100x8, alternatives=[second])
        assert lease.state is LeaseState.RUNNING and lease.region == "eu-west-1"
    finally:
        store.close()


def test_an_orphan_is_terminated_at_exactly_the_grace_period_not_before(kit):
    lc, rec, clouds, clock = kit
    orphan = clouds["gcp"].plant("l-gone", "us-central1", "a3-highgpu-8g", Market.ON_DEMAND)
    assert rec.run_pass().orphans_terminated == 0  # first seen now
    clock.advance(GRACE_S - 0.5)
    assert rec.run_pass().orphans_terminated == 0
    assert orphan.instance_id in clouds["gcp"].instances
    clock.advance(0.5)  # seen for exactly the grace period
    assert rec.run_pass().orphans_terminated == 1
    assert orphan.instance_id not in clouds["gcp"].instances


def test_an_orphan_that_disappears_starts_its_grace_period_again(kit):
    """A node missing from one listing is forgotten: when it is listed again, it waits anew."""
    lc, rec, clouds, clock = kit
    orphan = clouds["aws"].plant("l-gone", "us-east-1", "p5.48xlarge", Market.ON_DEMAND)
    rec.run_pass()
    clouds["aws"].vanish(orphan.instance_id)
    clock.advance(GRACE_S / 2)
    rec.run_pass()
    clouds["aws"].plant("l-gone", "us-east-1", "p5.48xlarge", Market.ON_DEMAND, instance_id=orphan.instance_id)
    clock.advance(GRACE_S / 2)
    assert rec.run_pass().orphans_terminated == 0  # seen again only now
    clock.advance(GRACE_S)
    assert rec.run_pass().orphans_terminated == 1


def test_a_blocked_offer_is_skipped_without_a_cloud_call_and_said_so(kit):
    """A capacity error blocks the offer's zone; the next launch there records each blocked zone as
    an attempt of its own and calls the cloud only where nothing is blocked."""
    lc, _, clouds, _ = kit
    clouds["aws"].capacity[("us-east-1", "p5.48xlarge")] = 0
    aws = lc.target_explicit("aws", "us-east-1", "", "p5.48xlarge", "on_demand", 1)
    gcp = lc.target_explicit("gcp", "us-central1", "", "a3-highgpu-8g", "on_demand", 1)
    first = lc.launch(idempotency_key="a", target=aws, demand=H100x8, alternatives=[gcp])
    assert first.provider == "gcp"
    calls = len([m for m, _ in clouds["aws"].calls if m == "launch"])
    second = lc.launch(idempotency_key="b", target=aws, demand=H100x8, alternatives=[gcp])
    assert second.state is LeaseState.RUNNING and second.provider == "gcp"
    assert len([m for m, _ in clouds["aws"].calls if m == "launch"]) == calls  # aws not asked again
    blocked = [a for a in second.attempts if a.provider == "aws"]
    assert blocked and all((a.code, a.kind, a.region) == ("blocked", "blocked", "us-east-1")
                           for a in blocked)
    assert {a.zone for a in blocked} == {"us-east-1a", "us-east-1b"}
    assert all(a.scope.startswith("aws/us-east-1") and a.message.startswith("blocked: ") for a in blocked)


def test_a_boot_script_that_cannot_be_rendered_fails_the_lease_at_once(tmp_path, mini_catalog):
    """The lease's own fault: no other offer is tried, and the attempt says why (in at most 300
    characters)."""
    def boot(lease, names):
        raise KeyError("x" * 400)

    clock = Clock(1_800_000_000.0)
    clouds = {name: FakeProvider(name, clock=clock) for name in ("aws", "gcp", "azure")}
    store = Store(f"sqlite:///{tmp_path / 'broker.db'}")
    try:
        lc = Lifecycle(store, clouds, QuoteEngine(mini_catalog), owner="test", clock=clock,
                       settings=Settings(backoff_s=0.0), sleep=lambda s: None, boot=boot)
        first, second = [lc.target_explicit(p, r, "", t, "on_demand", 1) for p, r, t in OFFERS[:2]]
        lease, _ = lc.create(idempotency_key="k", target=first, demand=H100x8, alternatives=[second],
                             bootstrap="slurm-node")
        with pytest.raises(LeaseError) as e:
            lc.provision(lease)
        failed = lc.get(lease.lease_id)
        assert failed.state is LeaseState.FAILED and failed.ended_at == clock()
        (a,) = failed.attempts
        assert (a.provider, a.region, a.code, a.kind, a.scope) == \
            ("aws", "us-east-1", "BootScript", "invalid", "")
        assert a.message.startswith("boot template 'slurm-node' cannot be rendered: ") and len(a.message) == 300
        assert list(e.value.attempts) == list(failed.attempts)
        assert _launched(clouds) == []  # no cloud was asked
    finally:
        store.close()


# -- what a launch records, and a launch of the same key by two callers -----------------------------------
def test_a_running_lease_records_each_node_as_the_cloud_made_it(kit):
    lc, _, clouds, clock = kit
    t = dataclasses.replace(lc.target_explicit("aws", "us-east-1", "", "p5.48xlarge", "on_demand", 2), zone="")
    lease = lc.launch(idempotency_key="k", target=t)  # no zone: the cloud picks one
    made = sorted(clouds["aws"].alive(), key=lambda i: i.instance_id)
    assert lease.zone == "us-east-1-a" and lease.state_reason == "2 nodes running in aws/us-east-1-a"
    assert sorted(lease.instances, key=lambda i: i.instance_id) == [
        records.Instance(instance_id=i.instance_id, node_name=i.node_name, zone=i.zone, private_ip=i.private_ip,
                         state=i.state, region=i.region) for i in made]
    assert (lease.started_at, lease.accrued_at, lease.idle_since) == (clock(), clock(), clock())


class WrongShape(FakeProvider):
    """A cloud that answers a launch with nodes of another type than asked."""

    def launch(self, spec):
        return [dataclasses.replace(i, instance_type="p4d.24xlarge") for i in super().launch(spec)]


class Partial(FakeProvider):
    """A cloud that brings up one node fewer than asked, and whose terminate fails once."""

    def launch(self, spec):
        return super().launch(spec)[1:]


def test_nodes_of_another_shape_are_given_back_and_the_offer_fails(tmp_path, mini_catalog):
    lc, _, clouds, _, store = _kit(tmp_path, mini_catalog, retries=1)
    try:
        wrong = clouds["aws"] = lc.providers["aws"] = WrongShape("aws")
        gcp = lc.target_explicit("gcp", "us-central1", "", "a3-highgpu-8g", "on_demand", 1)
        lease = lc.launch(idempotency_key="k", target=lc.target_explicit(*ZONED_AWS), demand=H100x8,
                          alternatives=[gcp])
        assert lease.provider == "gcp" and wrong.alive() == []
        shape = [a for a in lease.attempts if a.code == "ShapeMismatch"]
        assert shape and shape[0].message.startswith("the launch returned 1 node(s) of another shape (p4d.24xlarge")
        assert (shape[0].kind, shape[0].scope) == ("transient", SHAPE_SCOPE)
    finally:
        store.close()


def test_a_partial_gang_is_given_back_and_a_failed_give_back_logged(tmp_path, mini_catalog):
    lc, _, clouds, _, store = _kit(tmp_path, mini_catalog, retries=1)
    try:
        part = clouds["aws"] = lc.providers["aws"] = Partial("aws")
        part.fail("terminate", TransientError("503", provider="aws", code="ServiceUnavailable"))
        t = lc.target_explicit("aws", "us-east-1", "us-east-1a", "p5.48xlarge", "on_demand", 2)
        gcp = lc.target_explicit("gcp", "us-central1", "", "a3-highgpu-8g", "on_demand", 2)
        with capture_logs() as logs:
            lease = lc.launch(idempotency_key="k", target=t, demand=H100x8, alternatives=[gcp])
        assert lease.provider == "gcp" and part.alive() == []  # the second give-back (cleanup) went through
        partial = [a for a in lease.attempts if a.code == "PartialLaunch"]
        assert partial and partial[0].message == "only 1 of 2 nodes came up"
        assert (partial[0].kind, partial[0].scope) == ("capacity", "aws/us-east-1/us-east-1a")
        (e, *_) = [e for e in logs if e["event"] == "terminate_failed"]
        assert (e["lease"], e["provider"]) == (lease.lease_id, "aws") and "ServiceUnavailable" in e["error"]
    finally:
        store.close()


def _launch_held_in_the_cloud(kit):
    """A launch of key "k" on its own thread, held inside the cloud's call until ``gate`` is set:
    (lifecycle, target, gate, the launching thread, the list its lease is put in)."""
    lc, _, clouds, _ = kit
    gate, entered = threading.Event(), threading.Event()

    def held(spec):
        entered.set()
        assert gate.wait(30)

    clouds["aws"]._failures["launch"].append(held)
    t = lc.target_explicit(*ZONED_AWS)
    first: list = []
    a = threading.Thread(target=lambda: first.append(lc.launch(idempotency_key="k", target=t)))
    a.start()
    assert entered.wait(30)
    return lc, t, gate, a, first


def test_a_waiting_caller_gets_the_lease_as_the_launch_left_it_when_it_ends_between_two_looks(kit):
    """The launch ends just after the waiting caller read the lease (still provisioning): the
    caller looks once more and answers with the running lease, not the one it read."""
    lc, t, gate, a, first = _launch_held_in_the_cloud(kit)
    real_get, waiter = lc.get, threading.current_thread()

    def get_then_let_the_launch_end(lease_id):
        lease = real_get(lease_id)
        if threading.current_thread() is waiter and not gate.is_set():
            gate.set()  # the launch ends now, after this read
            a.join(30)
        return lease

    lc.get = get_then_let_the_launch_end
    second = lc.launch(idempotency_key="k", target=t)
    assert first[0].state is LeaseState.RUNNING
    assert second.lease_id == first[0].lease_id and second.state is LeaseState.RUNNING


def test_a_second_caller_of_the_same_key_waits_for_the_launch_in_progress(kit):
    lc, t, gate, a, first = _launch_held_in_the_cloud(kit)
    second: list = []
    b = threading.Thread(target=lambda: second.append(lc.launch(idempotency_key="k", target=t)))
    b.start()
    b.join(0.5)
    assert b.is_alive() and not second  # still launching: it waits
    gate.set()
    a.join(30)
    b.join(30)
    assert first[0].state is LeaseState.RUNNING
    assert second[0].lease_id == first[0].lease_id and second[0].state is LeaseState.RUNNING
    assert second[0].instance_ids == first[0].instance_ids


def test_a_retry_of_a_launch_that_failed_for_good_gets_the_same_answer(kit):
    lc, _, clouds, _ = kit
    clouds["aws"].capacity[("us-east-1", "p5.48xlarge")] = 0
    t = lc.target_explicit(*ZONED_AWS)
    with pytest.raises(LeaseError) as first:
        lc.launch(idempotency_key="k", target=t)
    with pytest.raises(LeaseError) as again:
        lc.launch(idempotency_key="k", target=t)
    assert str(again.value) == str(first.value) and list(again.value.attempts) == list(first.value.attempts)


def test_an_unknown_lease_is_not_found(kit):
    lc, _, _, _ = kit
    with pytest.raises(NotFound, match="lease l-nope does not exist."):
        lc.get("l-nope")


def test_a_drain_from_a_row_that_moved_on_applies_its_bookkeeping_to_the_fresh_row(kit):
    lc, _, _, clock = kit
    lease = lc.launch(idempotency_key="k", target=lc.target_explicit(*ZONED_AWS))
    lc.store.update_lease(lease, now=clock(), job_state=lease.job_state)  # someone's bookkeeping meanwhile
    clock.advance(3600)
    out = lc.drain(lease, "going")  # from the older row
    assert out.state is LeaseState.DRAINING and out.accrued_micros == lease.hourly_micros


def test_a_caller_stops_waiting_for_a_launch_in_progress_at_provision_timeout_s(tmp_path, mini_catalog):
    """The launch holding the lease hangs in the cloud call: a second caller of the key gets the lease
    as it stands once provision_timeout_s has passed, instead of waiting for it for ever, at most
    half a second late (it looks again every half second, and at every write of the launch)."""
    lc, _, clouds, _, store = _kit(tmp_path, mini_catalog, provision_timeout_s=1.0)
    waits, wait = [], store.wait_for_change
    store.wait_for_change = lambda timeout: (waits.append(timeout), wait(timeout))[-1]
    gate, entered = threading.Event(), threading.Event()

    def hung(spec):
        entered.set()
        assert gate.wait(60)

    clouds["aws"]._failures["launch"].append(hung)
    t = lc.target_explicit(*ZONED_AWS)
    a = threading.Thread(target=lambda: lc.launch(idempotency_key="k", target=t))
    a.start()
    try:
        assert entered.wait(30)
        second: list = []
        b = threading.Thread(target=lambda: second.append(lc.launch(idempotency_key="k", target=t)))
        b.start()
        b.join(30)
        assert not b.is_alive() and second[0].state is LeaseState.PROVISIONING
        assert waits and set(waits) == {0.5}
    finally:
        gate.set()
        a.join(30)
        store.close()


def test_a_launch_repeated_after_a_crash_returns_the_lease_as_it_stands(kit):
    """Nobody in this process is launching it: the caller gets the provisioning lease at once, and the
    reconciler resumes it."""
    lc, _, clouds, _ = kit
    t = lc.target_explicit(*ZONED_AWS)
    lease, _ = lc.create(idempotency_key="k", target=t)
    lc._begin_attempt(lease, t, [])  # the process died in the cloud call
    out: list = []
    b = threading.Thread(target=lambda: out.append(lc.launch(idempotency_key="k", target=t)))
    b.start()
    b.join(30)
    assert not b.is_alive() and out[0].state is LeaseState.PROVISIONING and out[0].lease_id == lease.lease_id
    assert [m for m, _ in clouds["aws"].calls if m == "launch"] == []


# -- what the writes log, and how often bookkeeping is re-applied -----------------------------------------
def test_each_state_change_is_logged_with_its_reason_and_bookkeeping_is_not(kit):
    lc, _, _, clock = kit
    with capture_logs() as logs:
        lease = lc.launch(idempotency_key="k", target=lc.target_explicit(*ZONED_AWS))
        lc.handoff(lease.lease_id, Job(job_id="j"))
        clock.advance(60)
        lc.release(lease.lease_id, "done")
    changes = [e for e in logs if e["event"] == "lease_state"]
    assert [(e["from_state"], e["to_state"], e["reason"]) for e in changes] == [
        (S.REQUESTED, S.PROVISIONING, "launching 1 x p5.48xlarge (on_demand) in aws/us-east-1a, attempt 1"),
        (S.PROVISIONING, S.RUNNING, "1 nodes running in aws/us-east-1a"),
        (S.RUNNING, S.DRAINING, "done"), (S.DRAINING, S.RELEASED, "done")]
    assert {(e["log_level"], e["lease"], e["provider"]) for e in changes} == {("info", lease.lease_id, "aws")}


def test_a_release_with_no_reason_says_released(kit):
    lc, _, _, _ = kit
    lease = lc.launch(idempotency_key="k", target=lc.target_explicit(*ZONED_AWS))
    assert lc.release(lease.lease_id, "").state_reason == "released"


def test_bookkeeping_that_keeps_losing_the_race_gives_up_after_three_tries(kit):
    lc, _, _, clock = kit
    lease = lc.launch(idempotency_key="k", target=lc.target_explicit(*ZONED_AWS))
    update, tries = lc.store.update_lease, []

    def racing(lease, **kw):  # someone's bookkeeping lands first, every time
        tries.append(lease.version)
        fresh = lc.store.get_lease(lease.lease_id)
        update(fresh, now=clock(), job_state=fresh.job_state)
        return update(lease, **kw)

    lc.store.update_lease = racing
    with pytest.raises(StaleLease, match=f"^lease {lease.lease_id} keeps changing under us$"):
        lc.handoff(lease.lease_id, Job(job_id="j"))
    assert len(tries) == 3


def test_a_hand_off_to_a_lease_released_meanwhile_is_stale_and_writes_nothing(kit):
    lc, _, _, _ = kit
    lease = lc.launch(idempotency_key="k", target=lc.target_explicit(*ZONED_AWS))
    lc.release(lease.lease_id, "done")
    lc.get = lambda lease_id: lease  # the hand-off read the running row
    with pytest.raises(StaleLease):
        lc.handoff(lease.lease_id, Job(job_id="j"))
    assert lc.store.get_lease(lease.lease_id).job == Job()


def test_a_launch_of_a_lease_moved_on_meanwhile_leaves_it_as_it_is_now(kit):
    lc, _, clouds, _ = kit
    lease, _ = lc.create(idempotency_key="k", target=lc.target_explicit(*ZONED_AWS))
    lc.release(lease.lease_id, "not needed")  # before this launch of the requested row wrote anything
    with capture_logs() as logs:
        out = lc.provision(lease)
    assert (out.state, out.state_reason, lc.inflight) == (S.RELEASED, "not needed", set())
    assert [m for m, _ in clouds["aws"].calls if m == "launch"] == []
    assert [e for e in logs if e["event"] == "provision_superseded"] == [
        {"event": "provision_superseded", "log_level": "info", "lease": lease.lease_id, "provider": "aws"}]


# -- what a new lease records, and the tenant's hourly cap at its edge ------------------------------------
def test_a_new_lease_records_what_it_was_asked_for(kit):
    lc, _, _, clock = kit
    demand = H100x8.validate()
    targets = [lc.target_explicit(p, r, "", t, "on_demand", 1) for p, r, t in OFFERS]
    lease, created = lc.create(idempotency_key="k", tenant="team-a", target=targets[0], demand=demand,
                               alternatives=targets[1:3], quote_id="q-1", offer_rank=2, job=Job(job_id="j"),
                               bootstrap="slurm-node", replaces="l-old")
    assert created and (lease.state, lease.tenant, lease.target, lease.demand, lease.alternatives) == \
        (S.REQUESTED, "team-a", targets[0], demand, tuple(targets[1:3]))
    assert (lease.quote_id, lease.offer_rank, lease.bootstrap, lease.replaces, lease.job_state) == \
        ("q-1", 2, "slurm-node", "l-old", "running")
    assert (lease.attempt, lease.client_token, lease.max_lifetime_s) == (0, f"{lease.lease_id}-1", 7 * 86400)
    assert (lease.created_at, lease.updated_at, lease.state_since) == (clock(), clock(), clock())
    again, created = lc.create(idempotency_key="k", tenant="team-a", target=targets[1])
    assert not created and again.lease_id == lease.lease_id
    bare, _ = lc.create(idempotency_key="k2", target=targets[0], max_lifetime_s=300)
    assert (bare.max_lifetime_s, bare.tenant, bare.quote_id, bare.offer_rank, bare.bootstrap, bare.replaces) == \
        (300, "default", "", 0, "", "")
    assert (bare.demand, bare.alternatives, bare.job, bare.job_state) == (None, (), Job(), "")
    assert lease.lease_id.startswith("l-") and bare.lease_id.startswith("l-") and bare.lease_id != lease.lease_id
    with pytest.raises(InvalidArgument, match=r"^idempotency_key is required\.$"):
        lc.create(idempotency_key="", target=targets[0])


def test_a_launch_fits_a_tenants_hourly_cap_exactly_and_one_node_more_does_not(kit):
    caps = Budgets(kit[0].store, {"team-a": Budget("team-a", usd_per_hour=Decimal("196.64"))})
    lc = Lifecycle(kit[0].store, kit[0].providers, kit[0].engine, owner="test", budgets=caps, clock=kit[3])
    two = lc.target_explicit("aws", "us-east-1", "", "p5.48xlarge", "on_demand", 2)
    one = dataclasses.replace(two, nodes=1)
    assert lc.launch(idempotency_key="a", tenant="team-a", target=two).state is S.RUNNING
    with pytest.raises(OverBudget) as e:
        lc.launch(idempotency_key="b", tenant="team-a", target=one)
    assert str(e.value) == ("budget team-a.usd_per_hour = 196.64 would be exceeded: 196.64 $/h already running "
                            "+ 98.32 $/h requested.")
    assert lc.store.lease_by_key("team-a", "b") is None
    assert lc.launch(idempotency_key="b", tenant="team-b", target=one).state is S.RUNNING  # no cap of its own
    lc.release(lc.store.lease_by_key("team-a", "a").lease_id)
    assert lc.launch(idempotency_key="c", tenant="team-a", target=one).state is S.RUNNING
    with pytest.raises(OverBudget, match=r"98.32 \$/h already running \+ 196.64 \$/h requested.$"):
        lc.launch(idempotency_key="d", tenant="team-a", target=two)  # the price of every node counts


def test_a_launch_of_a_schedulers_nodes_gives_them_its_names_and_is_busy(kit):
    lc, _, clouds, _ = kit
    t = lc.target_explicit("aws", "us-east-1", "us-east-1a", "p5.48xlarge", "on_demand", 2)
    lease = lc.launch(idempotency_key="k", target=t, job=Job(node_names=("gpu-1", "gpu-2")))
    assert sorted(i.node_name for i in lease.instances) == ["gpu-1", "gpu-2"] and lease.idle_since == 0.0
    assert [m for m, _ in clouds["aws"].calls] == ["launch"]  # one call, nothing to clean up after it


@pytest.mark.parametrize("error, blocked", [
    # names no region: the target's zone; an offer's scope: that type and market in the region
    (CapacityError("x", provider="aws", code="InsufficientCapacity"), "aws/us-east-1/us-east-1a"),
    (CapacityError("x", provider="aws", code="Unsupported", region="us-east-1", zone="us-east-1a", scope=Scope.OFFER),
     "aws/us-east-1/p5.48xlarge/on_demand"),
])
def test_a_refused_launch_names_in_its_attempt_what_it_blocked(kit, error, blocked):
    lc, _, clouds, clock = kit
    clouds["aws"].fail("launch", error)
    gcp = lc.target_explicit("gcp", "us-central1", "", "a3-highgpu-8g", "on_demand", 1)
    lease = lc.launch(idempotency_key="k", target=lc.target_explicit(*ZONED_AWS), alternatives=[gcp])
    assert lease.state is S.RUNNING
    assert (lease.attempts[0].zone, lease.attempts[0].code, lease.attempts[0].scope) == ("us-east-1a", error.code, blocked)
    assert lc.store.active_blocks(clock()) == {blocked: f"{error.code} on {blocked}"}


def test_a_months_cap_counts_only_what_was_spent_this_month(kit):
    lc, _, _, clock = kit
    caps = Budgets(lc.store, {"team-a": Budget("team-a", usd_per_month=Decimal("100"))})
    lc = Lifecycle(lc.store, lc.providers, lc.engine, owner="test", budgets=caps, clock=clock)
    t = lc.target_explicit(*ZONED_AWS)
    old = lc.launch(idempotency_key="a", tenant="team-a", target=t)
    clock.advance(2 * 3600)
    assert lc.release(old.lease_id).accrued_micros == 2 * 98_320_000  # over the cap, in this month
    with pytest.raises(OverBudget, match=r"^budget team-a.usd_per_month = 100 is spent: 196.64 \$ accrued"):
        lc.launch(idempotency_key="b", tenant="team-a", target=t)
    clock.advance(40 * 86400)  # the next month: last month's spend no longer counts
    assert lc.launch(idempotency_key="c", tenant="team-a", target=t).state is S.RUNNING
