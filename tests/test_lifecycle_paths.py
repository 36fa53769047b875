"""A launch's less common paths, against the in-memory clouds (tests/fake_provider.py): a lease
moved on while its cloud call ran, a provider that crashes, several shapes of one cloud in one
request, and a Capacity Block bought, waited for and launched into."""
from __future__ import annotations

import dataclasses

import pytest
from structlog.testing import capture_logs

from broker.lease import LeaseState
from broker.lifecycle import LeaseError
from broker.quote import QuoteEngine
from broker.targets import Target
from policies.demand import Demand
from providers.base import (TAG_LEASE, TAG_OWNER, AuthError, BlockState, CapacityError, Market, Scope, ThrottledError,
                            TransientError)
from tests.fake_provider import FakeBlocks, FakeProvider, FakeShapes
from tests.lease_kit import lifecycle_kit

S = LeaseState
GRACE_S = 60.0
ZONED_AWS = ("aws", "us-east-1", "us-east-1a", "p5.48xlarge", "on_demand", 1)
H100x8 = Demand(gpus=8, hours=1, gpu_model="H100")


def _kit(tmp_path, catalog, **settings):
    return lifecycle_kit(tmp_path, catalog, grace_s=GRACE_S, **settings)


@pytest.fixture
def kit(tmp_path, mini_catalog):
    lc, rec, clouds, clock, store = _kit(tmp_path, mini_catalog)
    yield lc, rec, clouds, clock
    store.close()


# -- a launch whose lease moved on while the cloud call ran ---------------------------------------------
def _released(lc, aws, spec):
    lc.release(spec.lease_id, "not needed")


def _adopted(lc, aws, spec):  # the reconciler found the nodes of this very call and adopted them
    return lc.adopt(lc.get(spec.lease_id), FakeProvider.launch(aws, spec))


def _adopted_then_drained(lc, aws, spec):
    lc.drain(_adopted(lc, aws, spec), "not needed")


@pytest.mark.parametrize("meanwhile, state, kept", [
    (_released, LeaseState.RELEASED, False),
    (_adopted, LeaseState.RUNNING, True),
    (_adopted_then_drained, LeaseState.DRAINING, False),
])
def test_a_launch_that_finishes_after_its_lease_moved_on_keeps_its_nodes_only_if_running_on_them(
        kit, meanwhile, state, kept):
    lc, _, clouds, _ = kit
    aws = clouds["aws"]
    aws._failures["launch"].append(lambda spec: meanwhile(lc, aws, spec))
    with capture_logs() as logs:
        out = lc.launch(idempotency_key="k", target=lc.target_explicit(*ZONED_AWS))
    made = set(aws._tokens[f"{out.lease_id}-1"])
    assert out.state is state and len(made) == 1
    assert {i.instance_id for i in aws.alive()} == (made if kept else set())
    assert out.instance_ids == (made if state is not LeaseState.RELEASED else set())
    late = [e for e in logs if e["event"] == "launched_after_release"]
    assert late == ([] if kept else [{"event": "launched_after_release", "log_level": "warning",
                                      "lease": out.lease_id, "provider": "aws", "state": state}])


def test_nodes_a_late_launch_cannot_give_back_are_left_to_the_reconciler(kit):
    lc, rec, clouds, clock = kit
    aws = clouds["aws"]
    err = TransientError("503", provider="aws", code="ServiceUnavailable")
    aws.fail("terminate", err)  # the release found nothing yet: this is the late launch's give-back
    aws._failures["launch"].append(lambda spec: _released(lc, aws, spec))
    with capture_logs() as logs:
        out = lc.launch(idempotency_key="k", target=lc.target_explicit(*ZONED_AWS))
    (left,) = aws.alive()
    assert out.state is LeaseState.RELEASED and left.lease_id == out.lease_id
    assert [e for e in logs if e["event"] == "terminate_failed"] == [
        {"event": "terminate_failed", "log_level": "warning", "lease": out.lease_id, "provider": "aws",
         "error": str(err)}]
    rec.run_pass()
    clock.advance(GRACE_S)
    rec.run_pass()
    assert aws.alive() == []


# -- a provider that raises what no provider error covers ------------------------------------------------
@pytest.mark.parametrize("raised, said", [
    (RuntimeError("  boom\nthe rest of it"), ": boom"),
    (RuntimeError("y" * 300), ": " + "y" * 200),
    (RuntimeError(), ""),
])
def test_a_crashing_provider_fails_its_cloud_in_one_line_and_the_launch_goes_on(kit, raised, said):
    lc, _, clouds, _ = kit
    clouds["aws"].fail("launch", raised)
    gcp = lc.target_explicit("gcp", "us-central1", "", "a3-highgpu-8g", "on_demand", 1)
    with capture_logs() as logs:
        lease = lc.launch(idempotency_key="k", target=lc.target_explicit(*ZONED_AWS), demand=H100x8,
                          alternatives=[gcp])
    assert lease.state is LeaseState.RUNNING and lease.target == gcp  # its price, type and market too
    crash, *skipped = [(a.zone, a.code, a.kind, a.scope, a.message) for a in lease.attempts]
    assert crash == ("us-east-1a", "RuntimeError", "providerfault", "aws", f"aws raised RuntimeError{said}")
    assert skipped == [("us-east-1b", "blocked", "blocked", "aws", "RuntimeError earlier in this launch")]
    (e,) = [e for e in logs if e["event"] == "launch_crashed"]
    at = e.pop("at")
    assert e == {"event": "launch_crashed", "log_level": "error", "lease": lease.lease_id, "provider": "aws",
                 "region": "us-east-1", "error": f"RuntimeError{said or ': '}"}
    assert at.startswith(FakeProvider.launch.__code__.co_filename + ":") and at.endswith(" in _scripted")
    assert [e for e in logs if e["event"] == "launch_failed"] == [
        {"event": "launch_failed", "log_level": "warning", "lease": lease.lease_id, "provider": "aws",
         "region": "us-east-1", "code": "RuntimeError", "scope": "cloud"}]


# -- several shapes of one cloud in one request (an EC2 Fleet, a GCP bulkInsert) --------------------------
def _shapes_kit(tmp_path, catalog, **settings):
    lc, _, clouds, clock, store = _kit(tmp_path, catalog, **settings)
    clouds["aws"] = lc.providers["aws"] = FakeShapes("aws", clock=clock)
    p5, g5 = [lc.target_explicit("aws", "us-east-1", z, t, "on_demand", 1)
              for z, t in (("us-east-1a", "p5.48xlarge"), ("", "g5.xlarge"))]
    return lc, clouds, store, p5, g5


SHAPES = [("p5.48xlarge", "us-east-1a"), ("p5.48xlarge", "us-east-1b"), ("g5.xlarge", "us-east-1a"),
          ("g5.xlarge", "us-east-1b")]


@pytest.mark.parametrize("zoned, shapes_asked, where, others", [
    (True, SHAPES, "us-east-1a", 3),
    (False, [("p5.48xlarge", ""), ("g5.xlarge", "")], "us-east-1", 1),  # no zone: each shape once, the cloud picks
])
def test_several_shapes_go_out_in_one_request_and_the_lease_records_the_one_it_got(tmp_path, mini_catalog, zoned,
                                                                                   shapes_asked, where, others):
    lc, clouds, store, p5, g5 = _shapes_kit(tmp_path, mini_catalog)
    if not zoned:
        p5, g5 = dataclasses.replace(p5, zone=""), dataclasses.replace(g5, zone="")
    try:
        aws = clouds["aws"]
        aws.capacity[("us-east-1", "p5.48xlarge")] = 0
        lease = lc.launch(idempotency_key="k", target=p5, alternatives=[g5])
        ((_, shapes),) = [arg for m, arg in aws.calls if m == "launch_shapes"]
        prices = {"p5.48xlarge": p5.hourly_micros, "g5.xlarge": g5.hourly_micros}
        assert [(s.instance.name, s.zone, s.market, s.hourly_micros) for s in shapes] == \
            [(t, z, Market.ON_DEMAND, prices[t]) for t, z in shapes_asked]
        assert "describe" not in [m for m, _ in aws.calls]  # one call: nothing of an earlier one to clean up
        assert (lease.state, lease.instance_type, lease.zone, lease.hourly_micros, lease.attempt, lease.attempts) == \
            (LeaseState.RUNNING, "g5.xlarge", "us-east-1a" if zoned else "us-east-1-a", g5.hourly_micros, 1, ())
        launching = [e.message for e in lc.store.events_of(lease.lease_id)
                     if e.kind == "state_changed" and e.to_state == "provisioning"]
        assert launching == [f"launching 1 x p5.48xlarge (on_demand) in aws/{where} or the best of {others} other "
                             "shapes, attempt 1"]
    finally:
        store.close()


@pytest.mark.parametrize("cap", [1, 2])
def test_a_several_shape_request_is_one_offer_tried_and_each_refused_shape_blocks_its_zone(tmp_path, mini_catalog,
                                                                                           cap):
    lc, clouds, store, p5, g5 = _shapes_kit(tmp_path, mini_catalog, max_failover=cap)
    try:
        aws = clouds["aws"]
        for itype in ("p5.48xlarge", "g5.xlarge"):
            aws.capacity[("us-east-1", itype)] = 0
        gcp = lc.target_explicit("gcp", "us-central1", "us-central1-a", "a3-highgpu-8g", "on_demand", 1)
        with capture_logs() as logs:
            if cap == 1:
                with pytest.raises(LeaseError):
                    lc.launch(idempotency_key="k", target=p5, alternatives=[g5, gcp])
            else:
                assert lc.launch(idempotency_key="k", target=p5, alternatives=[g5, gcp]).provider == "gcp"
        lease = lc.store.lease_by_key("default", "k")
        assert [e for e in logs if e["event"] == "launch_failed"] == [
            {"event": "launch_failed", "log_level": "warning", "lease": lease.lease_id, "provider": "aws",
             "region": "us-east-1", "code": "InsufficientCapacity", "scope": "zone", "shapes": 4}]
        assert [m for m, _ in aws.calls if m == "launch_shapes"] == ["launch_shapes"]  # none of them asked again
        assert [(a.instance_type, a.zone, a.kind, a.scope) for a in lease.attempts if a.provider == "aws"] == \
            [(t, z, "capacity", f"aws/us-east-1/{z}") for t, z in SHAPES]
        assert sorted(lc.store.active_blocks(lc.clock())) == ["aws/us-east-1/us-east-1a", "aws/us-east-1/us-east-1b"]
        assert len([m for m, _ in clouds["gcp"].calls if m == "launch"]) == cap - 1  # the request was offer 1
    finally:
        store.close()


# -- a Capacity Block: bought, waited for, launched into at its start (or given up) -----------------------
def _block_kit(tmp_path, catalog, **settings):
    lc, _, clouds, clock, store = _kit(tmp_path, catalog, **settings)
    clouds["aws"] = lc.providers["aws"] = FakeBlocks("aws", clock=clock)
    start = clock() + 3600
    p5 = catalog.find("aws", "us-east-1", "p5.48xlarge", Market.ON_DEMAND)
    block = dataclasses.replace(p5, market=Market.QUEUED, zones=("us-east-1a",), hourly_micros=30_000_000,
                                upfront_micros=240_000_000, offer_id="cb-1", starts_at=start, max_run_h=24)
    lc.engine = QuoteEngine(catalog.with_offerings((block,)), buy_capacity_blocks=True)
    target = Target("aws", "us-east-1", "us-east-1a", "p5.48xlarge", Market.QUEUED, 1, 30_000_000, "cb-1")
    return lc, clouds, clock, store, target, start


@pytest.mark.parametrize("state", [BlockState.ACTIVE, BlockState.CANCELLED])
def test_a_bought_block_is_launched_into_at_its_start_or_given_up_when_over(tmp_path, mini_catalog, state):
    lc, clouds, clock, store, target, start = _block_kit(tmp_path, mini_catalog)
    try:
        gcp = lc.target_explicit("gcp", "us-central1", "us-central1-a", "a3-highgpu-8g", "on_demand", 1)
        lease = lc.launch(idempotency_key="k", target=target, alternatives=[gcp])
        assert (lease.state, lease.market, lease.reservation, lease.starts_at) == \
            (LeaseState.REQUESTED, Market.RESERVED, "cr-1", start)
        clock.advance(3599)
        assert lc.provision(lease).version == lease.version  # not started: it waits, the cloud not asked
        clock.advance(1)
        clouds["aws"].set_block("cr-1", state)
        out = lc.provision(lc.get(lease.lease_id))
        aws_calls = [m for m, _ in clouds["aws"].calls]
        if state is BlockState.ACTIVE:  # launched into the block, whose start the lease keeps
            assert (out.state, out.provider, out.reservation, out.starts_at, out.attempts) == \
                (LeaseState.RUNNING, "aws", "cr-1", start, ())
            assert aws_calls == ["buy_capacity_block", "capacity_block", "launch"]
            assert clouds["aws"].calls[-1][1].reservation == "cr-1"  # into the reservation
        else:  # over: the next offer, which has no block to start at
            assert (out.state, out.provider, out.reservation, out.starts_at) == (LeaseState.RUNNING, "gcp", "", 0.0)
            assert [(a.code, a.message) for a in out.attempts] == \
                [("CapacityBlock.cancelled", "capacity block cr-1 is cancelled")]
            assert aws_calls == ["buy_capacity_block", "capacity_block"]
    finally:
        store.close()


def test_a_block_released_before_its_start_says_its_fee_stays_spent(tmp_path, mini_catalog):
    lc, _, _, store, target, _ = _block_kit(tmp_path, mini_catalog)
    try:
        lease = lc.launch(idempotency_key="k", target=target)
        done = lc.release(lease.lease_id, "not needed")
        bought, released = [e.message for e in store.events_of(lease.lease_id) if e.kind == "capacity_block"]
        assert done.state is S.RELEASED and bought.startswith("bought capacity block cr-1 ")
        assert released.startswith("released before capacity block cr-1 starts at ") and released.endswith("($240.00)")
    finally:
        store.close()


@pytest.mark.parametrize("market, zone", [("reserved", "us-east-1a"), ("on_demand", "")])
def test_a_reservation_or_a_target_with_no_zone_is_tried_once_not_zone_by_zone(kit, mini_catalog, market, zone):
    lc, _, clouds, _ = kit
    on_demand = mini_catalog.find("aws", "us-east-1", "p5.48xlarge", Market.ON_DEMAND)
    held = dataclasses.replace(on_demand, market=Market.RESERVED, reservation="cr-1")  # in any zone of the region
    lc.engine = QuoteEngine(mini_catalog.with_offerings((held,)))
    clouds["aws"].capacity[("us-east-1", "p5.48xlarge")] = 0
    t = dataclasses.replace(lc.target_explicit("aws", "us-east-1", "", "p5.48xlarge", market, 1), zone=zone)
    with pytest.raises(LeaseError):
        lc.launch(idempotency_key="k", target=t)
    assert [(a.zone, a.kind) for a in lc.store.lease_by_key("default", "k").attempts] == [(zone, "capacity")]
    assert len([m for m, _ in clouds["aws"].calls if m == "launch"]) == 1


def test_a_queued_launch_asks_for_the_longest_run_its_offering_allows(kit, mini_catalog):
    """GCP flex-start's maxRunDuration: the queued offering's own, of its cloud, region and type."""
    lc, _, clouds, _ = kit

    def queued(region, itype, hours):
        on_demand = mini_catalog.find("gcp", region, itype, Market.ON_DEMAND)
        return dataclasses.replace(on_demand, market=Market.QUEUED, max_run_h=hours)

    lc.engine = QuoteEngine(mini_catalog.with_offerings((
        queued("europe-west4", "a3-highgpu-8g", 12), queued("us-central1", "a2-highgpu-1g", 6),
        queued("us-central1", "a3-highgpu-8g", 24))))
    launches = [Target("gcp", "us-central1", "us-central1-a", "a3-highgpu-8g", Market.QUEUED, 1, 30_000_000),
                lc.target_explicit("gcp", "us-central1", "us-central1-a", "a3-highgpu-8g", "on_demand", 1),
                Target("gcp", "europe-west4", "europe-west4-a", "a2-highgpu-1g", Market.QUEUED, 1, 1_000_000)]
    for n, target in enumerate(launches):  # the last one's offering is no longer sold
        assert lc.launch(idempotency_key=f"k{n}", target=target).state is S.RUNNING
    assert [spec.max_run_h for m, spec in clouds["gcp"].calls if m == "launch"] == [24.0, 0.0, 0.0]


def test_a_lease_with_a_bootstrap_boots_its_rendered_script_and_one_without_none(kit):
    lc, _, clouds, _ = kit
    lc.boot = lambda lease, names: f"#!/bin/sh\n# {lease.bootstrap}: {' '.join(names)}"
    t = lc.target_explicit(*ZONED_AWS)
    booted = lc.launch(idempotency_key="a", target=t, bootstrap="slurm-node")
    lc.launch(idempotency_key="b", target=t)
    assert [spec.boot_script for m, spec in clouds["aws"].calls if m == "launch"] == [
        f"#!/bin/sh\n# slurm-node: {booted.lease_id}-1-0", ""]
    assert clouds["aws"].calls[0][1].tags == {TAG_LEASE: booted.lease_id, TAG_OWNER: "test"}  # whose nodes


def test_an_offer_that_can_no_longer_be_launched_fails_saying_why_and_the_launch_goes_on(kit):
    lc, _, clouds, _ = kit
    del lc.providers["azure"]  # disabled since the quote
    gone = Target("azure", "eastus", "", "Standard_ND96isr_H100_v5", Market.ON_DEMAND, 1, 98_000_000)
    dropped = Target("gcp", "us-central1", "", "a9-gone-8g", Market.ON_DEMAND, 1, 1)  # no longer in the catalog
    with capture_logs() as logs:
        lease = lc.launch(idempotency_key="k", target=gone, alternatives=[dropped, lc.target_explicit(*ZONED_AWS)])
    assert lease.state is S.RUNNING and lease.provider == "aws"
    assert [(a.provider, a.code, a.kind, a.scope, a.message) for a in lease.attempts] == [
        ("azure", "ProviderDisabled", "invalidrequest", "azure", "provider azure is not enabled"),
        ("gcp", "UnknownInstanceType", "invalidrequest", "gcp/us-central1", "unknown instance type a9-gone-8g")]
    assert [e for e in logs if e["event"] == "attempt_cleanup_failed"] == []
    assert [(e["provider"], e["code"], e["scope"]) for e in logs if e["event"] == "launch_failed"] == [
        ("azure", "ProviderDisabled", "cloud"), ("gcp", "UnknownInstanceType", "offer")]  # the whole cloud is out


def test_a_failover_to_an_offer_of_another_shape_takes_its_count_type_market_and_price(kit):
    lc, _, clouds, _ = kit
    clouds["aws"].capacity[("us-east-1", "p5.48xlarge")] = 0
    a2 = lc.target_explicit("gcp", "us-central1", "us-central1-b", "a2-highgpu-1g", "spot", 8)
    lease = lc.launch(idempotency_key="k", target=lc.target_explicit(*ZONED_AWS), alternatives=[a2])
    assert (lease.target, lease.state_reason) == (a2, "8 nodes running in gcp/us-central1-b")
    assert len(clouds["gcp"].alive()) == 8


def test_each_retry_of_a_throttled_launch_is_logged_with_its_lease(kit):
    lc, _, clouds, _ = kit
    clouds["aws"].fail("launch", ThrottledError("slow down", provider="aws", code="RequestLimitExceeded",
                                                region="us-east-1"), times=2)
    with capture_logs() as logs:
        lease = lc.launch(idempotency_key="k", target=lc.target_explicit(*ZONED_AWS))
    assert lease.state is S.RUNNING and lease.attempt == 3
    assert [e for e in logs if e["event"] == "launch_retry"] == 2 * [
        {"event": "launch_retry", "log_level": "info", "lease": lease.lease_id, "provider": "aws", "delay_s": 0.0}]


def test_a_launch_in_progress_shows_the_attempts_that_failed_before_it(kit):
    """Each attempt is written before its cloud call, with the failed ones so far: a lease read while
    the broker is on its next offer says why (and a launch resumed after a crash keeps them)."""
    lc, _, clouds, _ = kit
    clouds["aws"].capacity[("us-east-1", "p5.48xlarge")] = 0
    seen = []
    clouds["gcp"]._failures["launch"].append(lambda spec: seen.append(lc.get(spec.lease_id)))
    gcp = lc.target_explicit("gcp", "us-central1", "", "a3-highgpu-8g", "on_demand", 1)
    lease = lc.launch(idempotency_key="k", target=lc.target_explicit(*ZONED_AWS), alternatives=[gcp])
    (during,) = seen
    assert during.state is S.PROVISIONING and (during.provider, during.attempt) == ("gcp", 3)
    assert [(a.provider, a.zone, a.kind) for a in during.attempts] == \
        [("aws", "us-east-1a", "capacity"), ("aws", "us-east-1b", "capacity")] == \
        [(a.provider, a.zone, a.kind) for a in lease.attempts]


# -- what counts as one offer against max_failover ---------------------------------------------------------
@pytest.mark.parametrize("cap", [2, 3])
def test_each_several_shape_request_counts_as_one_offer(tmp_path, mini_catalog, cap):
    lc, clouds, store, p5, g5 = _shapes_kit(tmp_path, mini_catalog, max_failover=cap)
    try:
        clouds["gcp"] = lc.providers["gcp"] = FakeShapes("gcp", clock=lc.clock)
        for name, region, itype in (("aws", "us-east-1", "p5.48xlarge"), ("aws", "us-east-1", "g5.xlarge"),
                                    ("gcp", "us-central1", "a3-highgpu-8g"), ("gcp", "us-central1", "a2-highgpu-1g")):
            clouds[name].capacity[(region, itype)] = 0
        a3, a2 = [lc.target_explicit("gcp", "us-central1", "", t, "on_demand", 1)
                  for t in ("a3-highgpu-8g", "a2-highgpu-1g")]
        azure = lc.target_explicit("azure", "eastus", "", "Standard_ND96isr_H100_v5", "on_demand", 1)
        if cap == 2:  # one request on each cloud: the third cloud is not tried
            with pytest.raises(LeaseError):
                lc.launch(idempotency_key="k", target=p5, alternatives=[g5, a3, a2, azure])
        else:
            assert lc.launch(idempotency_key="k", target=p5, alternatives=[g5, a3, a2, azure]).provider == "azure"
        assert [[m for m, _ in clouds[c].calls if m == "launch_shapes"] for c in ("aws", "gcp")] == \
            [["launch_shapes"], ["launch_shapes"]]
    finally:
        store.close()


def test_the_capacity_blocks_of_one_type_and_region_are_one_offer(tmp_path, mini_catalog):
    """With max_failover = 1, a second Capacity Block of the offer tried is still tried (it is the
    same offer), while a new offer between them is not."""
    lc, _, _, _, store = _kit(tmp_path, mini_catalog, max_failover=1)
    try:
        cb1, cb2 = [Target("aws", "us-east-1", "us-east-1a", "p5.48xlarge", Market.QUEUED, 1, 30_000_000, f"cb-{n}")
                    for n in (1, 2)]
        g5 = lc.target_explicit("aws", "us-east-1", "", "g5.xlarge", "on_demand", 1)
        with pytest.raises(LeaseError):
            lc.launch(idempotency_key="k", target=cb1, alternatives=[g5, cb2])
        assert [(a.instance_type, a.code) for a in lc.store.lease_by_key("default", "k").attempts] == \
            2 * [("p5.48xlarge", "CapacityBlockNotBought")]  # buying them is off
    finally:
        store.close()


def test_another_reservation_of_a_given_up_blocks_offer_is_the_same_offer(tmp_path, mini_catalog):
    lc, clouds, clock, store, target, _ = _block_kit(tmp_path, mini_catalog, max_failover=1)
    try:
        g5 = lc.target_explicit("aws", "us-east-1", "", "g5.xlarge", "on_demand", 1)
        other = Target("aws", "us-east-1", "us-east-1a", "p5.48xlarge", Market.RESERVED, 1, 0, "cr-9")
        lease = lc.launch(idempotency_key="k", target=target, alternatives=[g5, other])
        clock.advance(3600)
        clouds["aws"].set_block("cr-1", BlockState.CANCELLED)
        out = lc.provision(lc.get(lease.lease_id))
        assert (out.state, out.instance_type, out.reservation) == (S.RUNNING, "p5.48xlarge", "cr-9")
    finally:
        store.close()


def test_a_launch_tries_each_zone_of_each_offer_once_in_rank_order_cloud_by_cloud(kit):
    lc, _, _, _ = kit
    p5a, p5b = [lc.target_explicit("aws", "us-east-1", z, "p5.48xlarge", "on_demand", 1)
                for z in ("us-east-1a", "us-east-1b")]
    a3 = lc.target_explicit("gcp", "us-central1", "us-central1-b", "a3-highgpu-8g", "on_demand", 1)
    g5 = lc.target_explicit("aws", "us-east-1", "us-east-1b", "g5.xlarge", "on_demand", 1)
    order = [(t.provider, t.instance_type, t.zone) for t in lc.failover_order(p5a, [p5b, a3, g5, p5a])]
    assert order == [("aws", "p5.48xlarge", "us-east-1a"), ("aws", "p5.48xlarge", "us-east-1b"),
                     ("aws", "g5.xlarge", "us-east-1b"), ("aws", "g5.xlarge", "us-east-1a"),
                     ("gcp", "a3-highgpu-8g", "us-central1-b"), ("gcp", "a3-highgpu-8g", "us-central1-a")]


def test_an_auth_error_without_a_code_is_named_as_one_on_the_offers_it_rules_out(kit):
    lc, _, clouds, _ = kit
    clouds["aws"].fail("launch", AuthError("denied", provider="aws"))
    gcp = lc.target_explicit("gcp", "us-central1", "", "a3-highgpu-8g", "on_demand", 1)
    lease = lc.launch(idempotency_key="k", target=lc.target_explicit(*ZONED_AWS), alternatives=[gcp])
    assert [(a.zone, a.code, a.message) for a in lease.attempts] == [
        ("us-east-1a", "AuthError", "denied"), ("us-east-1b", "blocked", "auth error earlier in this launch")]


# -- a several-shape request that fails as a whole ---------------------------------------------------------
@pytest.mark.parametrize("raised, said", [(RuntimeError("  boom\nthe rest"), ": boom"),
                                          (RuntimeError("y" * 300), ": " + "y" * 200), (RuntimeError(), "")])
def test_a_crashing_several_shape_request_fails_its_cloud_in_one_line(tmp_path, mini_catalog, raised, said):
    lc, clouds, store, p5, g5 = _shapes_kit(tmp_path, mini_catalog)
    try:
        clouds["aws"].fail("launch_shapes", raised)
        gcp = lc.target_explicit("gcp", "us-central1", "us-central1-a", "a3-highgpu-8g", "on_demand", 1)
        with capture_logs() as logs:
            lease = lc.launch(idempotency_key="k", target=p5, alternatives=[g5, gcp])
        assert lease.target == gcp
        assert [(a.instance_type, a.zone, a.code, a.kind, a.scope, a.message) for a in lease.attempts] == [
            ("p5.48xlarge", "us-east-1a", "RuntimeError", "providerfault", "aws", f"aws raised RuntimeError{said}")]
        (crash,) = [e for e in logs if e["event"] == "launch_crashed"]
        assert crash.pop("at").endswith(" in _scripted") and crash == {
            "event": "launch_crashed", "log_level": "error", "lease": lease.lease_id, "provider": "aws",
            "region": "us-east-1", "error": f"RuntimeError{said or ': '}"}
        assert [e for e in logs if e["event"] == "launch_failed"] == [
            {"event": "launch_failed", "log_level": "warning", "lease": lease.lease_id, "provider": "aws",
             "region": "us-east-1", "code": "RuntimeError", "scope": "cloud", "shapes": 4}]
    finally:
        store.close()


def test_a_several_shape_request_retried_after_a_timeout_gives_back_what_the_lost_call_made(tmp_path, mini_catalog):
    lc, clouds, store, p5, g5 = _shapes_kit(tmp_path, mini_catalog)
    try:
        aws, made = clouds["aws"], []

        def made_then_timed_out(request):
            spec, shapes = request
            made.extend(FakeProvider.launch(aws, dataclasses.replace(
                spec, instance=shapes[2].instance, zone=shapes[2].zone, client_token="lost")))
            raise TransientError("read timeout", provider="aws", code="RequestTimeout", region=spec.region)

        aws.fail("launch_shapes", made_then_timed_out)
        with capture_logs() as logs:
            lease = lc.launch(idempotency_key="k", target=p5, alternatives=[g5])
        assert [e for e in logs if e["event"] == "launch_retry"] == [
            {"event": "launch_retry", "log_level": "info", "lease": lease.lease_id, "provider": "aws", "delay_s": 0.0}]
        assert (lease.state, lease.instance_type, lease.attempt) == (S.RUNNING, "p5.48xlarge", 2)
        assert [(a.code, a.kind, a.message) for a in lease.attempts] == \
            [("RequestTimeout", "transient", "read timeout")]
        assert made and {i.instance_id for i in aws.alive()} == lease.instance_ids  # the lost call's node is gone
    finally:
        store.close()


class PartialShapes(FakeShapes):
    """A cloud whose several-shape request brings up one node fewer than asked."""

    def launch_shapes(self, spec, shapes):
        shape, made = super().launch_shapes(spec, shapes)
        return shape, made[1:]


def test_a_several_shape_request_that_brings_up_too_few_nodes_gives_them_back(tmp_path, mini_catalog):
    lc, clouds, store, _, _ = _shapes_kit(tmp_path, mini_catalog)
    try:
        aws = clouds["aws"] = lc.providers["aws"] = PartialShapes("aws", clock=lc.clock)
        err = TransientError("503", provider="aws", code="ServiceUnavailable")
        aws.fail("terminate", err)
        p5, g5, gcp = [lc.target_explicit(p, r, z, t, "on_demand", 2) for p, r, z, t in (
            ("aws", "us-east-1", "us-east-1a", "p5.48xlarge"), ("aws", "us-east-1", "", "g5.xlarge"),
            ("gcp", "us-central1", "us-central1-a", "a3-highgpu-8g"))]
        with capture_logs() as logs:
            lease = lc.launch(idempotency_key="k", target=p5, alternatives=[g5, gcp])
        assert lease.target == gcp and aws.alive() == []  # the give-back failed once, the clean-up went through
        assert lc.store.active_blocks(lc.clock()) == {
            "aws/us-east-1/us-east-1a": "PartialLaunch on aws/us-east-1/us-east-1a"}
        assert [(a.code, a.kind, a.scope, a.message) for a in lease.attempts] == [
            ("PartialLaunch", "capacity", "aws/us-east-1/us-east-1a",
             "only 1 of 2 nodes of one asked-for shape came up")]
        assert [e for e in logs if e["event"] == "terminate_failed"] == [
            {"event": "terminate_failed", "log_level": "warning", "lease": lease.lease_id, "provider": "aws",
             "error": str(err)}]
    finally:
        store.close()


def test_a_several_shape_request_records_the_market_of_the_shape_it_got(tmp_path, mini_catalog):
    lc, clouds, store, p5, _ = _shapes_kit(tmp_path, mini_catalog)
    try:
        clouds["aws"].fail("launch", CapacityError("full", provider="aws", code="InsufficientCapacity",
                                                   region="us-east-1", zone="us-east-1a"), times=2)
        spot = lc.target_explicit("aws", "us-east-1", "us-east-1a", "p5.48xlarge", "spot", 1)
        lease = lc.launch(idempotency_key="k", target=p5, alternatives=[spot])
        assert lease.target == spot  # the on-demand shape was refused in both zones
    finally:
        store.close()


def test_queued_capacity_is_launched_alone_even_where_several_shapes_go_out_in_one_request(tmp_path, mini_catalog):
    lc, clouds, store, _, g5 = _shapes_kit(tmp_path, mini_catalog)
    try:
        flex = Target("aws", "us-east-1", "us-east-1a", "p5.48xlarge", Market.QUEUED, 1, 30_000_000)
        assert lc.launch(idempotency_key="k", target=flex, alternatives=[g5]).market is Market.QUEUED
        assert [m for m, _ in clouds["aws"].calls] == ["launch"]
    finally:
        store.close()


def test_a_refused_shape_blocks_what_its_error_covers(tmp_path, mini_catalog):
    lc, clouds, store, p5, g5 = _shapes_kit(tmp_path, mini_catalog)
    try:
        aws = clouds["aws"]
        aws.fail("launch", CapacityError("not sold here", provider="aws", code="Unsupported", region="us-east-1",
                                         scope=Scope.OFFER))  # the first shape's refusal: its offer, every zone
        for itype in ("p5.48xlarge", "g5.xlarge"):
            aws.capacity[("us-east-1", itype)] = 0
        gcp = lc.target_explicit("gcp", "us-central1", "us-central1-a", "a3-highgpu-8g", "on_demand", 1)
        assert lc.launch(idempotency_key="k", target=p5, alternatives=[g5, gcp]).provider == "gcp"
        assert lc.store.active_blocks(lc.clock()) == {
            "aws/us-east-1/p5.48xlarge/on_demand": "Unsupported on aws/us-east-1/p5.48xlarge/on_demand",
            "aws/us-east-1/us-east-1a": "InsufficientCapacity on aws/us-east-1/us-east-1a",
            "aws/us-east-1/us-east-1b": "InsufficientCapacity on aws/us-east-1/us-east-1b"}
    finally:
        store.close()
