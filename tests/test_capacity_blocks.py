"""Buying an AWS Capacity Block at launch: only with ``[market] buy_capacity_blocks`` on and when
the tenant's month budget covers its whole fee (recorded atomically: concurrent launches never
overshoot), then the lease waits for the block's start and launches into its capacity
reservation (with the gang's placement group and EFA). Real boto3 against the mocked EC2, whose
``PurchaseCapacityBlock`` speaks EC2's query API."""
from __future__ import annotations

import dataclasses
import threading
from decimal import Decimal

import botocore.exceptions
import pytest

from broker.budget import Budgets
from broker.config import Budget
from broker.errors import FailedPrecondition
from broker.lease import EventKind, LeaseState
from broker.lifecycle import Lifecycle, Settings
from broker.quote import QuoteEngine
from broker.reconciler import Reconciler
from broker.store import Store
from policies.demand import Demand
from providers.base import TAG_LEASE, BlockOrder, CapacityError, InvalidRequestError, Market
from providers.market import fetch
from providers.market.overlay import overlay
from tests.clouds.aws import aws_cloud, aws_cloud_server  # noqa: F401  (fixtures)
from tests.lease_kit import Clock
from tests.stores import db_url  # noqa: F401  (fixture)
from tests.test_provider_aws import OWNER, make_provider

pytestmark = pytest.mark.timeout(120)

NOW = 1_796_000_000.0  # 2026-11-30T00:53:20Z
H = 3600.0
START = NOW + 30 * H  # the block's start: 2026-12-01T06:53:20Z
FEE = 240_000_000  # $10 per node-hour x 24 h, for one node


@pytest.fixture
def clock(aws_cloud):
    c = Clock(NOW)
    aws_cloud.clock = c  # the mocked EC2 judges a block's state by the same time
    return c


@pytest.fixture
def market(aws_cloud, mini_catalog, clock):
    """The mini catalog with the live market over it: one Capacity Block on sale in us-east-1a."""
    aws_cloud.market.add_capacity_block("us-east-1a", "p5.48xlarge", START, "10")
    snap = fetch("aws", aws_cloud.provider_settings(["us-east-1"]), mini_catalog, NOW)
    cat, _ = overlay(mini_catalog, {"aws": snap}, now=NOW, max_age_h=0)
    return cat


def _engine(cat, buy: bool = True) -> QuoteEngine:
    return QuoteEngine(cat, enabled_providers=["aws"], regions={"aws": ["us-east-1"]}, buy_capacity_blocks=buy)


def _lifecycle(store, aws_cloud, engine, clock, month_usd: float | None = None) -> Lifecycle:
    budgets = Budgets(store, {"default": Budget("default", usd_per_month=Decimal(str(month_usd)))}) \
        if month_usd is not None else None
    return Lifecycle(store, {"aws": make_provider(aws_cloud)}, engine, owner=OWNER, budgets=budgets,
                     settings=Settings(backoff_s=0.0), clock=clock, sleep=lambda _: None)


def _block_target(engine: QuoteEngine, nodes: int = 1, deadline: float | None = None):
    q = engine.quote(Demand(gpus=8 * nodes, hours=10, gpu_model="H100", nodes=nodes,
                            deadline=deadline or NOW + 60 * H), now=NOW)
    targets = q.targets()
    assert targets[0].market is Market.QUEUED and targets[0].reservation.startswith("cb-"), targets[0]
    return targets[0], list(targets[1:])


@pytest.fixture
def store(tmp_path):
    s = Store(f"sqlite:///{tmp_path / 'broker.db'}")
    yield s
    s.close()


def _events(store, lease_id: str, kind: EventKind) -> list[str]:
    return [e.message for e in store.events_of(lease_id) if e.kind == kind.value]


# -- the whole way: bought within budget, waited for, launched into at its start ---------------

def test_a_block_within_budget_is_bought_once_waited_for_and_launched_into_at_its_start(
        aws_cloud, market, clock, store):
    engine = _engine(market)
    lc = _lifecycle(store, aws_cloud, engine, clock, month_usd=1000)
    target, _ = _block_target(engine, nodes=2)  # a gang: the fee is for both nodes
    lease = lc.launch(idempotency_key="k1", target=target)

    # bought: one purchase of the 2-node offering starting at the quoted time, tagged with the lease
    (buy,) = [c.params for c in aws_cloud.calls if c.action == "PurchaseCapacityBlock"]
    assert buy["InstancePlatform"] == "Linux/UNIX"
    (block,) = aws_cloud.capacity_blocks()
    assert buy["CapacityBlockOfferingId"] == block.offering_id != target.reservation  # the 2-node offering
    assert (block.total, block.zone, block.start, block.tags[TAG_LEASE]) == (2, "us-east-1a", START, lease.lease_id)
    # ...and waiting, visibly: no instance yet, the fee recorded against the budget
    assert lease.state is LeaseState.REQUESTED and lease.state_reason == (
        f"waiting for capacity block {block.id} (scheduled) to start at 2026-12-01T06:53Z")
    assert (lease.market, lease.reservation, lease.starts_at) == (Market.RESERVED, block.id, START)
    assert lease.accrued_micros == 2 * FEE and lease.hourly_micros == 0
    assert lc.budgets.usage("default", NOW)[1] == 2 * FEE
    (note,) = _events(store, lease.lease_id, EventKind.CAPACITY_BLOCK)
    assert note.startswith(f"bought capacity block {block.id} (offering {target.reservation}) for $480.00 up front")
    assert "not refundable" in note
    assert aws_cloud.count("RunInstances") == 0

    rec = Reconciler(lc, clock=clock, orphan_grace_s=0)
    clock.advance(29 * H)  # the launch time limit counts from the block's start, not the lease's creation
    rec.run_pass()
    assert lc.get(lease.lease_id).state is LeaseState.REQUESTED and aws_cloud.count("RunInstances") == 0
    assert aws_cloud.count("PurchaseCapacityBlock") == 1

    clock.now = START + 60  # the block is active: the next pass launches into it
    rec.run_pass()
    lease = lc.get(lease.lease_id)
    assert lease.state is LeaseState.RUNNING and len(lease.instances) == 2, lease.state_reason
    (run,) = [c.params for c in aws_cloud.calls if c.action == "RunInstances"]
    assert run["CapacityReservationSpecification.CapacityReservationTarget.CapacityReservationId"] == block.id
    assert run["InstanceMarketOptions.MarketType"] == "capacity-block"
    assert run["Placement.GroupName"] and run["NetworkInterface.1.InterfaceType"] == "efa"  # the gang's fabric
    assert aws_cloud.count("PurchaseCapacityBlock") == 1
    # the fee is what it cost: nothing accrues by the hour on top
    clock.advance(5 * H)
    assert lc.budgets.usage("default", clock.now)[1] == 2 * FEE


def test_released_before_its_start_the_block_is_not_refunded_and_says_so(aws_cloud, market, clock, store):
    engine = _engine(market)
    lc = _lifecycle(store, aws_cloud, engine, clock, month_usd=1000)
    lease = lc.launch(idempotency_key="k1", target=_block_target(engine)[0])
    released = lc.release(lease.lease_id)
    assert released.state is LeaseState.RELEASED and released.accrued_micros == FEE
    notes = _events(store, lease.lease_id, EventKind.CAPACITY_BLOCK)
    assert len(notes) == 2 and notes[1].startswith(f"released before capacity block {lease.reservation} starts")
    assert "not refundable" in notes[1] and notes[1].endswith("($240.00)")
    assert lc.budgets.usage("default", NOW + H)[1] == FEE  # still spent this month
    clock.now = START + 60
    Reconciler(lc, clock=clock, orphan_grace_s=0).run_pass()
    assert aws_cloud.count("RunInstances") == 0


def test_a_block_that_ended_before_its_lease_launched_fails_the_launch_saying_so(aws_cloud, market, clock, store):
    engine = _engine(market)
    lc = _lifecycle(store, aws_cloud, engine, clock, month_usd=1000)
    lease = lc.launch(idempotency_key="k1", target=_block_target(engine)[0])
    clock.now = START + 25 * H  # past its end
    with pytest.raises(FailedPrecondition):
        lc.provision(lc.get(lease.lease_id))
    lease = lc.get(lease.lease_id)
    assert lease.state is LeaseState.FAILED and aws_cloud.count("RunInstances") == 0
    assert lease.attempts[-1].code == "CapacityBlock.expired" and lease.accrued_micros == FEE


def test_a_lease_not_launched_within_the_time_limit_after_its_block_started_is_given_up(
        aws_cloud, market, clock, store):
    engine = _engine(market)
    lc = _lifecycle(store, aws_cloud, engine, clock, month_usd=1000)
    lease = lc.launch(idempotency_key="k1", target=_block_target(engine)[0])
    clock.now = START + lc.settings.provision_timeout_s + 1  # no pass since it started
    Reconciler(lc, clock=clock, orphan_grace_s=0).run_pass()
    lease = lc.get(lease.lease_id)
    assert lease.state is LeaseState.RELEASED and lease.state_reason.startswith("launch did not finish within")
    assert "not refundable" in _events(store, lease.lease_id, EventKind.CAPACITY_BLOCK)[-1]


# -- no purchase: buying off, over budget, a refusal ---------------------------------------------

def test_with_buying_off_nothing_is_bought(aws_cloud, market, clock, store):
    target, _ = _block_target(_engine(market, buy=True))
    lc = _lifecycle(store, aws_cloud, _engine(market, buy=False), clock, month_usd=1000)
    with pytest.raises(FailedPrecondition):
        lc.launch(idempotency_key="k1", target=target)
    (lease,) = store.list_leases()
    assert lease.state is LeaseState.FAILED and "buy_capacity_blocks is off" in lease.state_reason
    assert aws_cloud.count("PurchaseCapacityBlock") == 0 and lease.accrued_micros == 0


def test_over_budget_the_block_is_ruled_out_saying_why_and_the_launch_fails_over(aws_cloud, market, clock, store):
    engine = _engine(market)
    lc = _lifecycle(store, aws_cloud, engine, clock, month_usd=200)  # < the $240 fee
    target, rest = _block_target(engine)
    with pytest.raises(FailedPrecondition) as e:
        lc.launch(idempotency_key="alone", target=target)
    assert "does not cover the capacity block's 240.00 $ paid up front" in str(e.value)
    (lease,) = store.list_leases()
    (attempt,) = lease.attempts
    assert (attempt.code, attempt.kind) == ("OverBudget", "budget")
    assert attempt.message.startswith("budget default.usd_per_month = 200 does not cover")
    assert lease.accrued_micros == 0 and aws_cloud.count("PurchaseCapacityBlock") == 0
    # with alternatives, the launch goes on to the next offer (on demand), nothing bought
    other = lc.launch(idempotency_key="k2", target=target, demand=Demand(gpus=8, hours=10, gpu_model="H100"),
                      alternatives=rest)
    assert other.state is LeaseState.RUNNING and other.market is Market.ON_DEMAND
    assert aws_cloud.count("PurchaseCapacityBlock") == 0 and not aws_cloud.capacity_blocks()


@pytest.mark.parametrize("code, kind", [("InsufficientCapacity", CapacityError),
                                        ("InvalidCapacityBlockOfferingId.NotFound", InvalidRequestError)])
def test_a_refused_purchase_is_a_typed_error_and_nothing_is_spent(aws_cloud, market, clock, store, code, kind):
    engine = _engine(market)
    lc = _lifecycle(store, aws_cloud, engine, clock, month_usd=1000)
    aws_cloud.inject("capacity" if kind is CapacityError else "invalid", match="PurchaseCapacityBlock", code=code)
    with pytest.raises(FailedPrecondition):
        lc.launch(idempotency_key="k1", target=_block_target(engine)[0])
    (lease,) = store.list_leases()
    (attempt,) = lease.attempts
    assert attempt.code == code and attempt.kind == kind.__name__.removesuffix("Error").lower()
    assert lease.accrued_micros == 0 and lc.budgets.usage("default", NOW)[1] == 0
    assert not aws_cloud.capacity_blocks()


def test_the_provider_buys_idempotently_on_the_lease_and_maps_ec2_errors(aws_cloud, market, clock):
    p = make_provider(aws_cloud)
    (offer,) = [o for o in market.offerings if o.market is Market.QUEUED]
    order = BlockOrder(offer.offer_id, "us-east-1", "us-east-1a", "p5.48xlarge", 1, START, 24.0, FEE)
    first = p.buy_capacity_block(order, "lease-a")
    again = p.buy_capacity_block(order, "lease-a")  # after a crash: the block bought before
    assert again.reservation_id == first.reservation_id and aws_cloud.count("PurchaseCapacityBlock") == 1
    assert (str(first.state), first.starts_at, first.ends_at, first.fee_micros) == ("scheduled", START, START + 24 * H, FEE)
    clock.now = START
    assert str(p.capacity_block("us-east-1", first.reservation_id).state) == "active"
    clock.now = START + 24 * H
    assert p.capacity_block("us-east-1", first.reservation_id).state.over
    with pytest.raises(InvalidRequestError) as e:
        p.buy_capacity_block(dataclasses.replace(order, offering_id="cb-0000000000000000f"), "lease-b")
    assert e.value.code == "InvalidCapacityBlockOfferingId.NotFound"
    # a gang's offering dearer than the quoted fee x nodes is not bought
    with pytest.raises(CapacityError) as e:
        p.buy_capacity_block(dataclasses.replace(order, count=2, max_fee_micros=FEE), "lease-c")
    assert e.value.code == "CapacityBlockPriceChanged" and aws_cloud.count("PurchaseCapacityBlock") == 2


def test_the_mocked_ec2_refuses_a_purchase_the_real_api_would(aws_cloud, market):
    ec2 = aws_cloud.client("us-east-1")
    with pytest.raises(botocore.exceptions.ClientError) as e:
        ec2.purchase_capacity_block(CapacityBlockOfferingId="cb-0000000000000000f", InstancePlatform="Linux/UNIX")
    assert e.value.response["Error"]["Code"] == "InvalidCapacityBlockOfferingId.NotFound"
    (offer,) = [o for o in market.offerings if o.market is Market.QUEUED]
    with pytest.raises(botocore.exceptions.ClientError) as e:
        ec2.purchase_capacity_block(CapacityBlockOfferingId=offer.offer_id, InstancePlatform="BeOS")
    assert e.value.response["Error"]["Code"] == "InvalidParameterValue"
    assert not aws_cloud.capacity_blocks()


# -- concurrency: the budget check and the recorded fee are one step ----------------------------

LAUNCHES = 8


def test_concurrent_purchases_never_overshoot_the_month_budget(aws_cloud, market, clock, db_url):  # noqa: F811
    engine = _engine(market)
    target, _ = _block_target(engine)
    stores = [Store(db_url), Store(db_url)]  # two replicas of one store
    try:
        replicas = [_lifecycle(s, aws_cloud, engine, clock, month_usd=1000) for s in stores]  # 4 fees fit
        start = threading.Barrier(LAUNCHES)
        outcomes: list[str] = []
        lock = threading.Lock()

        def launch(i: int) -> None:
            lc = replicas[i % 2]
            start.wait()
            try:
                out = lc.launch(idempotency_key=f"k{i}", target=target).state.value
            except FailedPrecondition as e:
                out = "budget" if "does not cover" in str(e) else str(e)
            with lock:
                outcomes.append(out)

        threads = [threading.Thread(target=launch, args=(i,)) for i in range(LAUNCHES)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert sorted(outcomes) == ["budget"] * 4 + ["requested"] * 4, outcomes
        assert aws_cloud.count("PurchaseCapacityBlock") == 4 and len(aws_cloud.capacity_blocks()) == 4
        spent = sum(l.accrued_micros for l in stores[0].list_leases())
        assert spent == 4 * FEE <= 1000 * 1_000_000
    finally:
        for s in stores:
            s.close()


# -- the quote: launchable when buying is on, deadline rules, start and price shown -----------

def test_with_buying_on_a_block_is_offered_when_its_start_meets_the_deadline(market):
    from broker.views import quote_to_dict

    engine = _engine(market)
    d = Demand(gpus=8, hours=10, gpu_model="H100", deadline=NOW + 60 * H)
    doc = quote_to_dict(engine.quote(d, now=NOW))
    (q,) = [o for o in doc["offers"] if o["market"] == "queued"]
    assert (q["rank"], q["starts_at"], q["upfront_usd"], q["cost_usd"]["compute"]) == (1, "2026-12-01T06:53:20Z", 240.0, 240.0)
    late = quote_to_dict(engine.quote(dataclasses.replace(d, deadline=NOW + 35 * H), now=NOW))
    assert all(o["market"] != "queued" for o in late["offers"])
    (ex,) = [e for e in late["excluded"] if e["market"] == "queued"]
    assert ex["kind"] == "deadline" and ex["reason"] == (
        "starts at 2026-12-01T06:53Z and finishes after the deadline 2026-12-01T11:53Z: needs 40.0 h from now")
    assert (ex["starts_at"], ex["upfront_usd"]) == ("2026-12-01T06:53:20Z", 240.0)


def test_the_quote_table_shows_the_blocks_start_fee_and_that_it_is_not_refundable(market, capsys):
    from broker.quote_command import print_table
    from broker.views import quote_to_dict

    doc = quote_to_dict(_engine(market).quote(Demand(gpus=16, hours=10, gpu_model="H100", nodes=2), now=NOW))
    print_table(doc)
    out = " ".join(capsys.readouterr().out.split())
    assert ("#1 aws p5.48xlarge queued: starts at 2026-12-01T06:53:20Z, $480.00 up front, not refundable, "
            "runs at most 24 h") in out
