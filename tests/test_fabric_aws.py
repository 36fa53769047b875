"""EFA at launch on EC2, read off the mocked cloud: a multi-node gang of an EFA type gets one EFA
per network card the catalog gives the type, in a self-referencing security group, and a cluster
placement group (inside a capacity reservation too); a single node gets none of it."""
from __future__ import annotations

import pytest

from providers.aws.fabric import fabric_group_name
from providers.base import TAG_OWNER, Fabric, Market
from providers.catalog import bundled
from tests.clouds.aws import aws_cloud, aws_cloud_server  # noqa: F401  (fixtures)
from tests.test_provider_aws import OWNER, make_provider, run_calls, server_side, spec

P5 = bundled().instance("aws", "p5.48xlarge")
P4D = bundled().instance("aws", "p4d.24xlarge")
G5 = bundled().instance("aws", "g5.xlarge")


def nics(params: dict[str, str]) -> list[dict[str, str]]:
    out, n = [], 1
    while f"NetworkInterface.{n}.DeviceIndex" in params:
        pre = f"NetworkInterface.{n}."
        out.append({k[len(pre):]: v for k, v in params.items() if k.startswith(pre)})
        n += 1
    return out


def test_catalog_gives_each_efa_type_its_network_cards():
    assert (P5.fabric, P5.fabric_nics) == (Fabric.EFA, 32)
    assert (P4D.fabric, P4D.fabric_nics) == (Fabric.EFA, 4)
    assert bundled().instance("aws", "p5en.48xlarge").fabric_nics == 16
    assert bundled().instance("aws", "p4de.24xlarge").fabric_nics == 4
    assert bundled().instance("azure", "Standard_ND96isr_H100_v5").fabric is Fabric.INFINIBAND
    assert G5.fabric is Fabric.ETHERNET and G5.fabric_for(2) is Fabric.ETHERNET
    assert P5.fabric_for(1) is Fabric.ETHERNET and P5.fabric_for(2) is Fabric.EFA


def test_two_node_p5_gang_gets_32_efas_a_fabric_group_and_a_cluster_group(aws_cloud):
    out = make_provider(aws_cloud).launch(spec("lease-f1", count=2, it=P5))
    assert len(out) == 2
    (params,) = run_calls(aws_cloud)
    got = nics(params)
    assert [n["NetworkCardIndex"] for n in got] == [str(i) for i in range(32)]
    assert [n["InterfaceType"] for n in got] == ["efa"] + ["efa-only"] * 31
    assert {n["DeviceIndex"] for n in got} == {"0"}
    assert "SubnetId" not in params and "SecurityGroupId.1" not in params
    assert params["Placement.GroupName"]
    # The group every interface carries allows all traffic from itself, and is the owner's.
    ec2 = aws_cloud.client("us-east-1")
    (group,) = ec2.describe_security_groups(
        Filters=[{"Name": "group-name", "Values": [fabric_group_name(OWNER)]}])["SecurityGroups"]
    assert {n["SecurityGroupId.1"] for n in got} == {group["GroupId"]}
    assert {"Key": TAG_OWNER, "Value": OWNER} in group["Tags"]
    (rule,) = [r for r in group["IpPermissions"] if r["IpProtocol"] == "-1"]
    assert [g["GroupId"] for g in rule["UserIdGroupPairs"]] == [group["GroupId"]]
    srv = server_side(aws_cloud, "lease-f1")
    assert all(len(s["network_interfaces"]) == 32 for s in srv)
    assert len({s["placement_group"] for s in srv}) == 1 and srv[0]["placement_group"]


def test_the_fabric_group_is_reused_by_the_next_gang(aws_cloud):
    make_provider(aws_cloud).launch(spec("lease-f2", count=2, it=P4D))
    make_provider(aws_cloud).launch(spec("lease-f3", count=2, it=P4D))
    assert aws_cloud.count("CreateSecurityGroup") == 1
    first, second = (nics(p) for p in run_calls(aws_cloud))
    assert len(first) == len(second) == 4
    assert first[0]["SecurityGroupId.1"] == second[0]["SecurityGroupId.1"]


def test_gang_in_a_capacity_reservation_gets_efa_and_a_placement_group(aws_cloud):
    rid = aws_cloud.add_capacity_reservation("us-east-1", "p5.48xlarge", "us-east-1b", 2)
    make_provider(aws_cloud).launch(spec("lease-f4", count=2, market=Market.RESERVED, it=P5, reservation=rid))
    (params,) = run_calls(aws_cloud)
    assert params["Placement.GroupName"] and len(nics(params)) == 32
    assert params["CapacityReservationSpecification.CapacityReservationTarget.CapacityReservationId"] == rid


@pytest.mark.parametrize("it", [P5, G5])
def test_single_node_launch_carries_no_fabric(aws_cloud, it):
    make_provider(aws_cloud).launch(spec("lease-f5", count=1, it=it))
    (params,) = run_calls(aws_cloud)
    assert not nics(params) and "Placement.GroupName" not in params
    assert aws_cloud.count("CreateSecurityGroup") == 0


def test_ethernet_gang_gets_a_placement_group_but_no_efa(aws_cloud):
    make_provider(aws_cloud).launch(spec("lease-f6", count=2, it=G5))
    (params,) = run_calls(aws_cloud)
    assert not nics(params) and params["Placement.GroupName"]


def test_mocked_ec2_refuses_efa_on_a_type_without_it(aws_cloud):
    ec2 = aws_cloud.client("us-east-1")
    image = aws_cloud.register_image()
    with pytest.raises(Exception) as e:
        ec2.run_instances(ImageId=image, InstanceType="g5.xlarge", MinCount=1, MaxCount=1,
                          NetworkInterfaces=[{"DeviceIndex": 0, "NetworkCardIndex": 0, "InterfaceType": "efa"}])
    assert "InvalidParameterCombination" in str(e.value)
    with pytest.raises(Exception) as e:
        ec2.run_instances(ImageId=image, InstanceType="p4d.24xlarge", MinCount=1, MaxCount=1,
                          NetworkInterfaces=[{"DeviceIndex": 0, "NetworkCardIndex": i, "InterfaceType": "efa"}
                                             for i in range(5)])
    assert "InvalidParameterValue" in str(e.value)


def test_efa_type_with_no_known_cards_is_not_quoted_as_a_fabric():
    from dataclasses import replace

    bare = replace(P5, fabric_nics=0)
    assert bare.fabric is Fabric.ETHERNET and bare.fabric_gbps == 0
    assert P5.fabric_gbps == 3200 and G5.fabric_gbps == G5.interconnect_gbps




def test_the_quote_reads_the_same_row_a_gang_without_known_fabric_nics_is_excluded():
    from dataclasses import replace

    from policies.cost import instance_reason
    from policies.demand import Demand

    d = Demand(gpus=16, hours=10, gpu_model="H100").validate()
    reason, nodes = instance_reason(d, P5)
    assert reason is None and nodes == 2
    reason, _ = instance_reason(d, replace(P5, fabric_nics=0))
    assert reason is not None and "no interconnect for a 2-node job" in reason.text


def test_efa_interfaces_use_the_configured_subnet_and_groups_in_its_vpc(aws_cloud):
    ec2 = aws_cloud.client("us-east-1")
    vpc = ec2.create_vpc(CidrBlock="10.7.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.7.1.0/24", AvailabilityZone="us-east-1a")["Subnet"]["SubnetId"]
    mine = ec2.create_security_group(GroupName="ops", Description="ops", VpcId=vpc)["GroupId"]
    p = make_provider(aws_cloud, subnet_ids={"us-east-1": subnet}, security_group_ids=[mine])
    p.launch(spec("lease-f7", count=2, it=P4D))
    (params,) = run_calls(aws_cloud)
    got = nics(params)
    assert {n["SubnetId"] for n in got} == {subnet}
    (fabric,) = ec2.describe_security_groups(
        Filters=[{"Name": "group-name", "Values": [fabric_group_name(OWNER)]}])["SecurityGroups"]
    assert fabric["VpcId"] == vpc
    assert all([n["SecurityGroupId.1"], n["SecurityGroupId.2"]] == [fabric["GroupId"], mine] for n in got)
    assert "SubnetId" not in params and "SecurityGroupId.1" not in params
