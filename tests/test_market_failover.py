"""Failover with the live market: a quota error re-reads the region's quota (real boto3 against
the mocked cloud) instead of blocking the region blindly; zones feed zone-to-zone failover."""
from __future__ import annotations

import time

import pytest

from broker import market, market_store
from broker.config import load
from broker.lifecycle import LeaseError
from broker.quote import Target
from broker.service import Service
from policies.cost import ExclusionKind
from policies.demand import Demand
from providers.base import Market
from providers.market import Snapshot, Zones
from tests.clouds.aws import aws_cloud, aws_cloud_server  # noqa: F401  (fixtures)


def wait_for(cond, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


@pytest.fixture
def service(aws_cloud, tmp_path, mini_catalog_dir):
    settings = aws_cloud.provider_settings(["us-east-1"], credentials="anonymous", read_timeout_s=5)
    config = load(None, environ={}, overrides={
        "store.url": f"sqlite:///{tmp_path / 'f.db'}", "catalog.path": str(mini_catalog_dir),
        "providers.aws": settings, "lifecycle": {"retries": 1, "max_failover": 1}})
    svc = Service(config)
    yield svc
    svc.stop()


def test_a_quota_error_refreshes_the_regions_quota_and_blocks_only_that_offer(service, aws_cloud):
    aws_cloud.market.set_quota("us-east-1", "L-417A185B", 96)  # fewer vCPUs than one p5 node
    aws_cloud.inject("quota", times=1, match="RunInstances")
    t = Target("aws", "us-east-1", "", "p5.48xlarge", Market.ON_DEMAND, 1, 98_320_000)
    with pytest.raises(LeaseError):
        service.lifecycle.launch(idempotency_key="k-quota", target=t)
    blocks = service.store.active_blocks(time.time())
    assert "aws/us-east-1/p5.48xlarge/on_demand" in blocks and "aws/us-east-1" not in blocks
    rows = wait_for(lambda: market_store.load(service.store.engine).get("aws"))
    assert [(q.key, q.limit) for q in rows.snapshot.quotas if q.key == "L-417A185B"] == [("L-417A185B", 96)]
    # once installed, the quote says why p5 on-demand in us-east-1 is out: the quota, not a block
    d = Demand(gpus=8, hours=1, gpu_model="H100").validate()

    def quota_excluded():
        q = service.engine.quote(d, now=time.time())
        return [e for e in q.excluded if e.kind is ExclusionKind.QUOTA]
    (ex,) = wait_for(quota_excluded)
    assert ex.offering.region == "us-east-1" and "96 of 96 P on-demand vCPUs" in ex.reason


def test_zone_targets_follow_the_live_zones(mini_catalog, tmp_path, mini_catalog_dir):
    from providers.market.overlay import overlay

    snap = Snapshot("aws", time.time(), zones=[Zones("us-east-1", "p5.48xlarge", ("us-east-1a", "us-east-1c", "us-east-1d"))])
    live, _ = overlay(mini_catalog, {"aws": snap}, now=time.time(), max_age_h=0)
    from broker.quote import QuoteEngine

    engine = QuoteEngine(live)
    t = Target("aws", "us-east-1", "us-east-1a", "p5.48xlarge", Market.ON_DEMAND, 1, 1)
    assert [x.zone for x in market.zone_targets(engine, t)] == ["us-east-1c", "us-east-1d"]
    assert market.zone_targets(engine, Target("aws", "us-east-1", "", "g9.none", Market.SPOT, 1, 1)) == []
