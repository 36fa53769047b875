"""Failover that tries what can work (issue 11, item 7) and status codes that tell a client what
to do (item 8): a quote offers only what this broker can launch and says why it excludes the
rest; a launch tries zone by zone through the region, then the cloud's other regions, then the
other clouds; a launch that failed for good is FAILED_PRECONDITION with every attempt, and a
retry with the same key gets the same answer. The real gRPC server, the real store, clouds in
memory (tests/fake_provider.py)."""
from __future__ import annotations

import grpc
import pytest

from broker import config as cfgmod
from broker.convert import demand_to_pb
from broker.service import Service
from broker.v1 import broker_pb2 as pb
from policies.demand import Demand
from providers.base import CapacityError
from tests.fake_provider import FakeProvider
from tests.lease_kit import serving

pytestmark = pytest.mark.timeout(60)

REGIONS = {"aws": ["us-east-1", "us-west-2"], "gcp": ["us-central1"], "azure": ["eastus"]}
SUB = "3f2b1c9e-5d4a-4e8b-9c7d-0a1b2c3d4e5f"
SETTINGS = {  # what each provider requires besides its regions (the clouds themselves are in memory)
    "aws": {"image_id": "ami-0123456789abcdef0"},
    "gcp": {"project": "test-project"},
    "azure": {"subscription_id": SUB, "resource_group": "broker-rg",
              "subnet_id": f"/subscriptions/{SUB}/resourceGroups/net-rg/providers/Microsoft.Network/"
                           "virtualNetworks/gpu-vnet/subnets/nodes",
              "ssh_public_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBroKerTestKey broker@test"},
}


@pytest.fixture
def broker(tmp_path):
    clouds = {name: FakeProvider(name) for name in REGIONS}
    cfg = cfgmod.load(None, environ={}, overrides={
        "store.url": f"sqlite:///{tmp_path / 'broker.db'}", "owner": "broker-test",
        "providers": {name: {"enabled": True, "regions": regions, **SETTINGS[name]}
                      for name, regions in REGIONS.items()},
        "lifecycle": {"backoff_s": 0, "retries": 1}})
    svc = Service(cfg, providers=clouds)
    try:
        with serving(svc) as stub:
            yield stub, svc, clouds
    finally:
        svc.stop()


def quote(stub, **demand):
    return stub.Quote(pb.QuoteRequest(demand=demand_to_pb(Demand(**demand))), timeout=30).quote


def launch(stub, q, key, rank=1):
    return stub.Launch(pb.LaunchRequest(idempotency_key=key, quote_offer=pb.QuoteOffer(
        quote_id=q.quote_id, rank=rank)), timeout=30).lease


def launched(cloud):
    return [(s.region, s.zone) for m, s in cloud.calls if m == "launch"]


def test_a_quote_offers_only_what_this_broker_can_launch_and_says_why(broker):
    stub, svc, _ = broker
    q = quote(stub, gpus=8, hours=4, gpu_model="H100")
    assert q.offers
    assert {(o.provider, o.region) for o in q.offers} <= {(p, r) for p, rs in REGIONS.items() for r in rs}
    unlaunchable = [e for e in q.excluded if e.kind == pb.EXCLUSION_KIND_NOT_LAUNCHABLE]
    assert unlaunchable, "offers in regions this broker is not configured for are not marked"
    e = next(e for e in unlaunchable if e.provider == "aws")
    assert e.reason == (f"not launchable here: aws region {e.region} is not in providers.aws.regions "
                        "(us-east-1, us-west-2)")


def test_capacity_in_one_zone_tries_the_other_zones_of_the_region(broker):
    stub, svc, clouds = broker
    aws = clouds["aws"]
    q = quote(stub, gpus=8, hours=4, gpu_model="H100", providers=("aws",), regions=("us-east-1",))
    assert {(o.provider, o.region, o.market) for o in q.offers} == {("aws", "us-east-1", pb.MARKET_ON_DEMAND)}
    first_zone = q.offers[0].zone
    aws.fail("launch", CapacityError("We currently do not have sufficient capacity", provider="aws",
                                     code="InsufficientInstanceCapacity", region="us-east-1", zone=first_zone),
             times=2)
    lease = launch(stub, q, "zones")
    assert lease.state == pb.LEASE_STATE_RUNNING and lease.region == "us-east-1"
    tried = launched(aws)
    assert len(tried) == 3 and len({z for _, z in tried}) == 3, tried  # zone, zone, zone: one region
    assert lease.zone == tried[-1][1] and lease.zone != first_zone


def test_with_one_cloud_full_the_launch_fails_over_to_another_cloud(broker):
    stub, svc, clouds = broker
    aws = clouds["aws"]
    for region in REGIONS["aws"]:
        for itype in ("p5.48xlarge", "p5en.48xlarge"):
            aws.capacity[(region, itype)] = 0
    q = quote(stub, gpus=8, hours=4, gpu_model="H100")
    assert q.offers[0].provider == "aws"
    lease = launch(stub, q, "full")
    assert lease.state == pb.LEASE_STATE_RUNNING and lease.provider in ("gcp", "azure")
    assert {r for r, _ in launched(aws)} <= set(REGIONS["aws"]), "tried a region this broker cannot use"
    attempts = svc.store.get_lease(lease.lease_id).attempts
    kinds = [a.provider for a in attempts]
    assert kinds == sorted(kinds, key=lambda p: p != "aws"), "went back to a cloud after leaving it"


def test_a_launch_that_failed_for_good_is_failed_precondition_and_a_retry_says_so_again(broker):
    stub, svc, clouds = broker
    for cloud in clouds.values():
        cloud.fail("launch", lambda spec: (_ for _ in ()).throw(CapacityError(
            "no capacity", provider=spec.tags and spec.instance.provider, code="InsufficientCapacity",
            region=spec.region, zone=spec.zone)), times=100)
    q = quote(stub, gpus=8, hours=4, gpu_model="H100")
    with pytest.raises(grpc.RpcError) as first:
        launch(stub, q, "doomed")
    assert first.value.code() == grpc.StatusCode.FAILED_PRECONDITION, first.value.details()
    lease = svc.store.lease_by_key("default", "doomed")
    assert lease.state.value == "failed"
    for a in lease.attempts:  # the error lists each attempt, with the zone it was made in
        where = f"{a.provider}/{a.region}" + (f"/{a.zone}" if a.zone else "")
        assert where in first.value.details()
    with pytest.raises(grpc.RpcError) as again:
        launch(stub, q, "doomed")
    assert (again.value.code(), again.value.details()) == (first.value.code(), first.value.details())
    assert svc.store.lease_by_key("default", "doomed").version == lease.version  # nothing retried
