"""A demand several offers of one cloud and region satisfy launches through one request (EC2 Fleet
``instant``): the real service and store, real boto3 and google-cloud-compute against the mocked
clouds on loopback; what went out is read off the mocked EC2's request log."""
from __future__ import annotations

import pytest

from broker.config import load
from broker.lease import LeaseState
from broker.quote import Target
from broker.service import Service
from policies.demand import Demand
from providers.base import Market
from tests.clouds.aws import aws_cloud, aws_cloud_server  # noqa: F401  (fixtures)
from tests.clouds.gcp import FakeGcpCompute, fake_gcp  # noqa: F401  (fixture)

pytestmark = pytest.mark.timeout(120)

G5 = Target("aws", "us-east-1", "us-east-1a", "g5.xlarge", Market.ON_DEMAND, 2, 1_006_000)
G6 = Target("aws", "us-east-1", "us-east-1a", "g6.xlarge", Market.ON_DEMAND, 2, 805_000)
A2 = Target("gcp", "us-central1", "us-central1-a", "a2-highgpu-1g", Market.ON_DEMAND, 2, 3_670_000)
DEMAND = Demand(gpus=2, hours=1, min_gpu_memory_gb=24).validate()


@pytest.fixture
def service(aws_cloud, fake_gcp: FakeGcpCompute, tmp_path):
    gcp = {"enabled": True, "project": "test-project", "regions": ["us-central1"], "api_endpoint": fake_gcp.url,
           "credentials": "anonymous", "timeout_s": 5}
    config = load(None, environ={}, overrides={
        "store.url": f"sqlite:///{tmp_path / 'fleet.db'}", "owner": "broker-test",
        "providers.aws": aws_cloud.provider_settings(["us-east-1"], credentials="anonymous", read_timeout_s=5),
        "providers.gcp": gcp, "lifecycle": {"retries": 1, "backoff_s": 0}})
    svc = Service(config)
    yield svc
    svc.stop()


def alive_aws(cloud, lease_id: str) -> list[dict]:
    return [i for i in cloud.instances() if i["tags"].get("broker:lease") == lease_id
            and i["state"] not in ("terminated", "shutting-down")]


def test_a_two_type_demand_is_one_fleet_request(service, aws_cloud):
    lease = service.lifecycle.launch(idempotency_key="k-1", target=G5, demand=DEMAND, alternatives=[G6])
    assert lease.state is LeaseState.RUNNING
    (fleet,) = aws_cloud.fleet_calls()
    assert aws_cloud.count("RunInstances") == 0
    asked = {v for k, v in fleet.params.items() if k.endswith(".InstanceType")}
    assert asked == {"g5.xlarge", "g6.xlarge"}
    assert (lease.instance_type, lease.hourly_micros, lease.nodes) == ("g5.xlarge", 1_006_000, 2)
    assert {i["instance_type"] for i in alive_aws(aws_cloud, lease.lease_id)} == {"g5.xlarge"}


def test_no_capacity_for_the_first_type_gets_the_second_in_the_same_request(service, aws_cloud):
    aws_cloud.set_capacity("g5.xlarge", "", 0)
    lease = service.lifecycle.launch(idempotency_key="k-2", target=G5, demand=DEMAND, alternatives=[G6])
    assert lease.state is LeaseState.RUNNING
    assert len(aws_cloud.fleet_calls()) == 1 and aws_cloud.count("RunInstances") == 0
    # The lease records the shape it got, at that shape's price.
    assert (lease.instance_type, lease.zone, lease.market, lease.hourly_micros) == (
        "g6.xlarge", "us-east-1a", Market.ON_DEMAND, 805_000)
    assert {i["instance_type"] for i in alive_aws(aws_cloud, lease.lease_id)} == {"g6.xlarge"}
    assert {i.instance_id for i in lease.instances} == {i["id"] for i in alive_aws(aws_cloud, lease.lease_id)}


def test_a_gang_partly_launched_is_rolled_back_and_the_next_cloud_is_tried(service, aws_cloud, fake_gcp):
    aws_cloud.reclaim_at_launch("g5.xlarge", 1)
    lease = service.lifecycle.launch(idempotency_key="k-3", target=G5, demand=DEMAND, alternatives=[G6, A2])
    assert lease.state is LeaseState.RUNNING
    assert (lease.provider, lease.instance_type, lease.hourly_micros) == ("gcp", "a2-highgpu-1g", 3_670_000)
    assert len(aws_cloud.fleet_calls()) == 1
    assert alive_aws(aws_cloud, lease.lease_id) == []
    assert [a.code for a in lease.attempts if a.provider == "aws"] == ["Server.InsufficientInstanceCapacity"]
    assert len([i for i in fake_gcp.instances() if i.get("status") != "TERMINATED"]) == 2


def test_every_type_refused_blocks_each_and_fails_over(service, aws_cloud, fake_gcp):
    aws_cloud.set_capacity("g5.xlarge", "", 0)
    aws_cloud.set_capacity("g6.xlarge", "", 0)
    lease = service.lifecycle.launch(idempotency_key="k-4", target=G5, demand=DEMAND, alternatives=[G6, A2])
    assert lease.provider == "gcp" and lease.state is LeaseState.RUNNING
    refused = [(a.instance_type, a.code) for a in lease.attempts if a.provider == "aws" and a.kind != "blocked"]
    assert ("g5.xlarge", "InsufficientInstanceCapacity") in refused
    assert ("g6.xlarge", "InsufficientInstanceCapacity") in refused
    assert len(aws_cloud.fleet_calls()) == 1


def test_a_single_offer_launches_as_before(service, aws_cloud):
    lone = Target("aws", "us-east-1", "", "g5.xlarge", Market.ON_DEMAND, 1, 1_006_000)
    lease = service.lifecycle.launch(idempotency_key="k-5", target=lone)
    assert lease.state is LeaseState.RUNNING and lease.instance_type == "g5.xlarge"
    assert aws_cloud.count("RunInstances") == 1 and aws_cloud.fleet_calls() == []


def test_gcp_offers_are_one_bulk_insert_per_type_across_the_zones(service, fake_gcp):
    fake_gcp.set_capacity("a2-highgpu-1g", "", 0)
    g2 = Target("gcp", "us-central1", "us-central1-b", "g2-standard-8", Market.ON_DEMAND, 2, 853_624)
    lease = service.lifecycle.launch(idempotency_key="k-6", target=A2, demand=DEMAND, alternatives=[g2])
    assert lease.state is LeaseState.RUNNING and lease.provider == "gcp"
    first, second = (c.body for c in fake_gcp.calls_to("POST", "/instances/bulkInsert"))
    assert fake_gcp.calls_to("POST", "/instances") == []
    assert first["instanceProperties"]["machineType"] == "a2-highgpu-1g"
    assert {"zones/us-central1-a", "zones/us-central1-b"} <= set(first["locationPolicy"]["locations"])
    assert second["instanceProperties"]["machineType"] == "g2-standard-8"
    # The lease records the shape it got, at that shape's price.
    assert (lease.instance_type, lease.hourly_micros) == ("g2-standard-8", 853_624)
    assert {i.zone for i in lease.instances} == {lease.zone}


def test_one_offer_in_several_zones_goes_zone_by_zone_as_before(service, aws_cloud):
    lease = service.lifecycle.launch(idempotency_key="k-7", target=G5, demand=DEMAND)
    assert lease.state is LeaseState.RUNNING
    assert aws_cloud.count("RunInstances") == 1 and aws_cloud.fleet_calls() == []
