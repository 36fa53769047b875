"""Several shapes in one EC2 Fleet ``instant`` request, read off the mocked cloud's request log: the
ranking as priorities, a refused type yielding the next in the same request, a gang got whole or
rolled back, the EFA interfaces and placement group carried by the launch template."""
from __future__ import annotations

import re
import urllib.error
import urllib.parse
import urllib.request

import pytest

from providers.aws.fleet import by_market
from providers.base import Market, NoShapeAvailable, PartialFulfilment, Shape, ShapesProvider
from providers.catalog import bundled
from tests.clouds.aws import aws_cloud, aws_cloud_server  # noqa: F401  (fixtures)
from tests.test_provider_aws import make_provider, server_side, spec

P5 = bundled().instance("aws", "p5.48xlarge")
P4D = bundled().instance("aws", "p4d.24xlarge")
G5 = bundled().instance("aws", "g5.xlarge")
G6 = bundled().instance("aws", "g6.xlarge")


def fleets(cloud) -> list[dict[str, str]]:
    return [c.params for c in cloud.fleet_calls()]


def overrides(params: dict[str, str]) -> list[dict[str, str]]:
    out = []
    n = 1
    while f"LaunchTemplateConfigs.{n}.LaunchTemplateSpecification.LaunchTemplateName" in params:
        m = 1
        while f"LaunchTemplateConfigs.{n}.Overrides.{m}.InstanceType" in params:
            pre = f"LaunchTemplateConfigs.{n}.Overrides.{m}."
            out.append({k[len(pre):]: v for k, v in params.items() if k.startswith(pre)})
            m += 1
        n += 1
    return sorted(out, key=lambda o: float(o["Priority"]))


def test_aws_is_a_shapes_provider(aws_cloud):
    assert isinstance(make_provider(aws_cloud), ShapesProvider)


def test_two_types_go_out_as_one_fleet_request_with_the_ranking_as_priorities(aws_cloud):
    p = make_provider(aws_cloud)
    shapes = [Shape(G5, "us-east-1a", Market.ON_DEMAND, 1_006_000), Shape(G6, "us-east-1b", Market.ON_DEMAND, 805_000)]
    got, nodes = p.launch_shapes(spec("lease-a1", count=2, it=G5), shapes)
    assert got == shapes[0]
    assert [(n.instance_type, n.zone, n.market) for n in nodes] == [("g5.xlarge", "us-east-1a", Market.ON_DEMAND)] * 2
    (params,) = fleets(aws_cloud)
    assert aws_cloud.count("RunInstances") == 0
    assert params["Type"] == "instant"
    assert params["TargetCapacitySpecification.TotalTargetCapacity"] == "2"
    assert params["TargetCapacitySpecification.DefaultTargetCapacityType"] == "on-demand"
    assert params["OnDemandOptions.AllocationStrategy"] == "prioritized"
    assert params["OnDemandOptions.MinTargetCapacity"] == "2"
    assert params["OnDemandOptions.SingleInstanceType"] == "true"
    assert params["OnDemandOptions.SingleAvailabilityZone"] == "true"
    assert [(o["InstanceType"], o["AvailabilityZone"], o["Priority"]) for o in overrides(params)] == [
        ("g5.xlarge", "us-east-1a", "0.0"), ("g6.xlarge", "us-east-1b", "1.0")]
    # The nodes carry the lease's tags and names; the templates are gone again.
    assert sorted(s["tags"]["Name"] for s in server_side(aws_cloud, "lease-a1")) == ["lease-a1-n1", "lease-a1-n2"]
    assert aws_cloud.client().describe_launch_templates()["LaunchTemplates"] == []


def test_a_type_without_capacity_yields_the_next_in_the_same_request(aws_cloud):
    aws_cloud.set_capacity("g5.xlarge", "us-east-1a", 0)
    p = make_provider(aws_cloud)
    shapes = [Shape(G5, "us-east-1a", Market.ON_DEMAND), Shape(G6, "us-east-1b", Market.ON_DEMAND)]
    got, nodes = p.launch_shapes(spec("lease-a2", count=2, it=G5), shapes)
    assert got == shapes[1]
    assert {(n.instance_type, n.zone) for n in nodes} == {("g6.xlarge", "us-east-1b")}
    assert len(fleets(aws_cloud)) == 1 and aws_cloud.count("RunInstances") == 0


def test_every_type_refused_names_each_with_ec2s_code(aws_cloud):
    aws_cloud.set_capacity("g5.xlarge", "", 0)
    aws_cloud.set_capacity("g6.xlarge", "us-east-1b", 1)  # fewer than the gang's minimum
    p = make_provider(aws_cloud)
    shapes = [Shape(G5, "us-east-1a", Market.ON_DEMAND), Shape(G6, "us-east-1b", Market.ON_DEMAND)]
    with pytest.raises(NoShapeAvailable) as e:
        p.launch_shapes(spec("lease-a3", count=2, it=G5), shapes)
    assert [(s.instance.name, err.code, err.zone) for s, err in e.value.failures] == [
        ("g5.xlarge", "InsufficientInstanceCapacity", "us-east-1a"),
        ("g6.xlarge", "InsufficientInstanceCapacity", "us-east-1b")]
    assert e.value.code == "InsufficientInstanceCapacity"
    assert [s for s in server_side(aws_cloud, "lease-a3") if s["state"] != "terminated"] == []


def test_a_gang_with_a_node_lost_at_launch_is_rolled_back(aws_cloud):
    aws_cloud.reclaim_at_launch("p4d.24xlarge", 1)
    p = make_provider(aws_cloud)
    shapes = [Shape(P4D, "us-east-1a", Market.ON_DEMAND), Shape(P5, "us-east-1a", Market.ON_DEMAND)]
    with pytest.raises(PartialFulfilment) as e:
        p.launch_shapes(spec("lease-a4", count=2, it=P4D), shapes)
    assert (e.value.got, e.value.wanted, e.value.code) == (1, 2, "Server.InsufficientInstanceCapacity")
    srv = server_side(aws_cloud, "lease-a4")
    assert len(srv) == 2 and all(s["state"] in ("terminated", "shutting-down") for s in srv)
    assert aws_cloud.placement_groups("us-east-1") == []


def test_an_efa_gang_fleet_carries_interfaces_and_placement_group_per_type(aws_cloud):
    p = make_provider(aws_cloud)
    shapes = [Shape(P5, "us-east-1a", Market.ON_DEMAND), Shape(P4D, "us-east-1a", Market.ON_DEMAND)]
    aws_cloud.set_capacity("p5.48xlarge", "", 0)
    got, nodes = p.launch_shapes(spec("lease-a5", count=2, it=P5), shapes)
    assert got.instance is P4D and len(nodes) == 2
    (params,) = fleets(aws_cloud)
    # One launch template per network layout: 32 EFA cards for p5, 4 for p4d.
    assert params["LaunchTemplateConfigs.1.Overrides.1.InstanceType"] == "p5.48xlarge"
    assert params["LaunchTemplateConfigs.2.Overrides.1.InstanceType"] == "p4d.24xlarge"
    srv = server_side(aws_cloud, "lease-a5")
    assert all(len(s["network_interfaces"]) == 4 for s in srv)
    assert {n["InterfaceType"] for n in srv[0]["network_interfaces"]} == {"efa", "efa-only"}
    assert len({s["placement_group"] for s in srv}) == 1 and srv[0]["placement_group"]


def test_spot_and_on_demand_shapes_are_one_request_per_market_in_rank_order(aws_cloud):
    aws_cloud.set_capacity("g5.xlarge", "", 0)
    p = make_provider(aws_cloud)
    shapes = [Shape(G5, "us-east-1a", Market.SPOT), Shape(G6, "us-east-1a", Market.ON_DEMAND),
              Shape(G6, "us-east-1b", Market.SPOT)]
    assert [m for m, _ in by_market(shapes)] == [Market.SPOT, Market.ON_DEMAND]
    got, nodes = p.launch_shapes(spec("lease-a6", count=1, it=G5), shapes)
    assert got == shapes[2] and nodes[0].market is Market.SPOT
    (params,) = fleets(aws_cloud)
    assert params["TargetCapacitySpecification.DefaultTargetCapacityType"] == "spot"
    assert params["SpotOptions.AllocationStrategy"] == "price-capacity-optimized"
    assert [o["InstanceType"] for o in overrides(params)] == ["g5.xlarge", "g6.xlarge"]


def test_a_repeated_attempt_is_answered_with_what_the_first_launched(aws_cloud):
    p = make_provider(aws_cloud)
    shapes = [Shape(G5, "us-east-1a", Market.ON_DEMAND), Shape(G6, "us-east-1b", Market.ON_DEMAND)]
    first = p.launch_shapes(spec("lease-a7", count=2, it=G5), shapes)
    again = p.launch_shapes(spec("lease-a7", count=2, it=G5), shapes)
    assert again[0] == first[0]
    assert {n.instance_id for n in again[1]} == {n.instance_id for n in first[1]}
    assert len(fleets(aws_cloud)) == 1


def test_one_shape_is_an_ordinary_launch(aws_cloud):
    p = make_provider(aws_cloud)
    got, nodes = p.launch_shapes(spec("lease-a8", count=1, it=G5), [Shape(G5, "us-east-1a", Market.ON_DEMAND)])
    assert got.instance is G5 and len(nodes) == 1
    assert aws_cloud.count("RunInstances") == 1 and fleets(aws_cloud) == []


def _post(cloud, params: dict[str, str]) -> tuple[int, bytes]:
    """The query request ``params`` sent to the mocked EC2 as a client would (region us-east-1)."""
    auth = ("AWS4-HMAC-SHA256 Credential=testing/20260101/us-east-1/ec2/aws4_request, "
            "SignedHeaders=host, Signature=0")
    req = urllib.request.Request(cloud.url + "/", data=urllib.parse.urlencode(params).encode(), method="POST",
                                 headers={"Content-Type": "application/x-www-form-urlencoded", "Authorization": auth})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_a_fleet_request_repeating_its_client_token_is_answered_as_the_first_was(aws_cloud):
    """EC2's idempotency for CreateFleet as for RunInstances: the same token and parameters get
    the first answer (no new instances), the same token with other parameters a mismatch."""
    p = make_provider(aws_cloud)
    p.launch_shapes(spec("lease-a8", count=2, it=G5),
                    [Shape(G5, "us-east-1a", Market.ON_DEMAND), Shape(G6, "us-east-1b", Market.ON_DEMAND)])
    (first,) = fleets(aws_cloud)
    assert first["ClientToken"]
    made = sorted(i["id"] for i in aws_cloud.instances())
    status, body = _post(aws_cloud, first)
    status_again, body_again = _post(aws_cloud, first)
    assert (status, status_again) == (200, 200) and body == body_again
    assert re.search(rb"<fleetId>[^<]+</fleetId>", body)
    assert sorted(i["id"] for i in aws_cloud.instances()) == made and len(fleets(aws_cloud)) == 3
    other = dict(first, **{"TargetCapacitySpecification.TotalTargetCapacity": "1"})
    status, body = _post(aws_cloud, other)
    assert status == 400 and b"<Code>IdempotentParameterMismatch</Code>" in body
    assert sorted(i["id"] for i in aws_cloud.instances()) == made
