"""The AWS provider driving real boto3 against the mocked EC2 (moto) on loopback."""
from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from providers.aws import AwsProvider, client_token, map_error, placement_group_name
from providers.registry import provider_settings
from providers.base import (
    TAG_LEASE,
    TAG_OWNER,
    AuthError,
    CapacityError,
    InstanceState,
    InstanceType,
    InvalidRequestError,
    LaunchSpec,
    Market,
    Provider,
    QuotaError,
    Scope,
    StopReason,
    ThrottledError,
    TransientError,
)
from providers.bootstrap import BootContext, render
from tests.clouds.aws import AwsCloud, aws_cloud, aws_cloud_server  # noqa: F401  (fixtures)

OWNER = "broker-test"
P4D = InstanceType("aws", "p4d.24xlarge", "A100", 8, 40, 96, 1152, "efa", 400)
G5 = InstanceType("aws", "g5.xlarge", "A10G", 1, 24, 4, 16, "ethernet", 10)
P5 = InstanceType("aws", "p5.48xlarge", "H100", 8, 80, 192, 2048, "efa", 3200)
MUNGE_KEY = base64.b64encode(bytes(range(64))).decode()


def make_provider(cloud: AwsCloud, regions=("us-east-1",), owner: str = OWNER, page_size: int = 500,
                  poll_s: float = 0.05, **extra) -> AwsProvider:
    settings = provider_settings("aws", cloud.provider_settings(regions, **extra))
    return AwsProvider(settings, owner, page_size=page_size, poll_s=poll_s)


def spec(lease: str = "lease-1", count: int = 1, market: Market = Market.ON_DEMAND, it: InstanceType = G5,
         region: str = "us-east-1", zone: str = "", **kw) -> LaunchSpec:
    names = tuple(f"{lease}-n{i + 1}" for i in range(count))
    return LaunchSpec(lease_id=lease, provider="aws", region=region, zone=zone, instance=it, market=market,
                      count=count, client_token=kw.pop("client_token", f"tok-{lease}"), node_names=names, **kw)


def server_side(cloud: AwsCloud, lease: str) -> list[dict]:
    return sorted((i for i in cloud.instances() if i["tags"].get(TAG_LEASE) == lease),
                  key=lambda i: i["tags"].get("Name", ""))


def run_calls(cloud: AwsCloud) -> list[dict[str, str]]:
    return [c.params for c in cloud.calls if c.action == "RunInstances"]


# --- launches ----------------------------------------------------------------------------------


def test_is_a_provider(aws_cloud):
    assert isinstance(make_provider(aws_cloud), Provider)


def test_on_demand_single_node(aws_cloud):
    p = make_provider(aws_cloud)
    script = render("slurm", BootContext("lease-1", "lease-1-n1", "aws", "us-east-1",
                                         settings={"conf_server": "ctl.example:6817", "munge_key": MUNGE_KEY}))
    out = p.launch(spec(boot_script=script, tags={"team": "vision", "Name": "x", TAG_OWNER: "someone"}))

    assert len(out) == 1
    inst = out[0]
    assert inst.provider == "aws" and inst.market is Market.ON_DEMAND and inst.lease_id == "lease-1"
    assert inst.node_name == "lease-1-n1" and inst.zone.startswith("us-east-1") and inst.private_ip
    assert inst.state in (InstanceState.PENDING, InstanceState.RUNNING)
    (srv,) = server_side(aws_cloud, "lease-1")
    assert srv["id"] == inst.instance_id and srv["instance_type"] == "g5.xlarge"
    assert srv["lifecycle"] == "" and srv["placement_group"] == "" and srv["capacity_reservation_id"] == ""
    assert srv["tags"] == {TAG_LEASE: "lease-1", TAG_OWNER: OWNER, "Name": "lease-1-n1", "team": "vision"}
    assert base64.b64decode(srv["user_data_b64"]).decode() == script
    assert srv["client_token"] == "tok-lease-1"
    (params,) = run_calls(aws_cloud)
    assert params["MinCount"] == params["MaxCount"] == "1"
    assert "InstanceMarketOptions.MarketType" not in params
    assert params["MetadataOptions.HttpTokens"] == "required"
    assert params["InstanceInitiatedShutdownBehavior"] == "terminate"
    assert aws_cloud.count("CreatePlacementGroup") == 0


def test_spot_multi_node_in_a_cluster_placement_group(aws_cloud):
    p = make_provider(aws_cloud)
    out = p.launch(spec("lease-2", count=2, market=Market.SPOT, it=P4D, max_price_micros=12_500_000))

    assert [i.node_name for i in out] == ["lease-2-n1", "lease-2-n2"]
    assert all(i.market is Market.SPOT for i in out)
    assert len({i.zone for i in out}) == 1
    srv = server_side(aws_cloud, "lease-2")
    assert [s["tags"]["Name"] for s in srv] == ["lease-2-n1", "lease-2-n2"]
    assert all(s["lifecycle"] == "spot" and s["instance_type"] == "p4d.24xlarge" for s in srv)
    assert {s["placement_group"] for s in srv} == {placement_group_name("lease-2")}
    (group,) = aws_cloud.placement_groups()
    assert group["Strategy"] == "cluster" and group["Tags"] == {TAG_LEASE: "lease-2", TAG_OWNER: OWNER}
    (params,) = run_calls(aws_cloud)
    assert params["MinCount"] == params["MaxCount"] == "2"
    assert params["InstanceMarketOptions.MarketType"] == "spot"
    assert params["InstanceMarketOptions.SpotOptions.SpotInstanceType"] == "one-time"
    assert params["InstanceMarketOptions.SpotOptions.InstanceInterruptionBehavior"] == "terminate"
    assert params["InstanceMarketOptions.SpotOptions.MaxPrice"] == "12.5"
    assert params["Placement.GroupName"] == "broker-lease-2"


def test_spot_without_a_cap_bids_up_to_on_demand(aws_cloud):
    make_provider(aws_cloud).launch(spec("lease-3", market=Market.SPOT))
    (params,) = run_calls(aws_cloud)
    assert params["InstanceMarketOptions.MarketType"] == "spot"
    assert "InstanceMarketOptions.SpotOptions.MaxPrice" not in params


def test_reserved_launch_targets_the_reservation_in_its_zone(aws_cloud):
    rid = aws_cloud.add_capacity_reservation("us-east-1", "p5.48xlarge", "us-east-1b", 2)
    p = make_provider(aws_cloud)
    out = p.launch(spec("lease-4", count=2, market=Market.RESERVED, it=P5, reservation=rid))

    assert {i.zone for i in out} == {"us-east-1b"}
    assert all(i.market is Market.RESERVED for i in out)
    srv = server_side(aws_cloud, "lease-4")
    assert [s["capacity_reservation_id"] for s in srv] == [rid, rid]
    # A gang in a reservation shares a cluster placement group too.
    assert len({s["placement_group"] for s in srv}) == 1 and srv[0]["placement_group"]
    assert all(s["lifecycle"] == "" for s in srv)
    (params,) = run_calls(aws_cloud)
    assert params["CapacityReservationSpecification.CapacityReservationTarget.CapacityReservationId"] == rid
    assert "InstanceMarketOptions.MarketType" not in params
    assert [i.market for i in p.describe("lease-4", "us-east-1")] == [Market.RESERVED] * 2


def test_reserved_capacity_block_uses_its_market_type(aws_cloud):
    rid = aws_cloud.add_capacity_reservation("us-east-1", "p5.48xlarge", "us-east-1c", 1,
                                             reservation_type="capacity-block")
    out = make_provider(aws_cloud).launch(spec("lease-5", market=Market.RESERVED, it=P5, reservation=rid))
    assert out[0].zone == "us-east-1c" and out[0].market is Market.RESERVED
    (params,) = run_calls(aws_cloud)
    assert params["InstanceMarketOptions.MarketType"] == "capacity-block"


def test_reserved_beyond_the_reservation_is_a_capacity_error(aws_cloud):
    rid = aws_cloud.add_capacity_reservation("us-east-1", "p5.48xlarge", "us-east-1b", 1)
    with pytest.raises(CapacityError) as e:
        make_provider(aws_cloud).launch(spec("lease-6", count=2, market=Market.RESERVED, it=P5, reservation=rid))
    assert e.value.code == "ReservationCapacityExceeded" and e.value.scope is Scope.OFFER
    assert e.value.zone == "us-east-1b"
    assert server_side(aws_cloud, "lease-6") == []


def test_reserved_unknown_or_missing_reservation_is_invalid(aws_cloud):
    p = make_provider(aws_cloud)
    with pytest.raises(InvalidRequestError) as e:
        p.launch(spec("lease-7", market=Market.RESERVED, it=P5, reservation="cr-0123456789abcdef0"))
    assert e.value.code == "InvalidCapacityReservationId.NotFound"
    with pytest.raises(InvalidRequestError) as e:
        p.launch(spec("lease-7", market=Market.RESERVED, it=P5))
    assert e.value.code == "NoReservation"
    assert aws_cloud.count("RunInstances") == 0


def test_boot_script_with_hostile_values_arrives_intact(aws_cloud):
    ctx = BootContext("lease-8", "lease-8-n1", "aws", "us-east-1", job_id="42",
                      env={"EVIL": "'; rm -rf / #\n$(reboot) `id` \"\\", "EMPTY": ""},
                      settings={"image": "nvcr.io/nvidia/pytorch:24.01-py3", "command": ["python", "train.py"]})
    script = render("container", ctx)
    make_provider(aws_cloud).launch(spec("lease-8", boot_script=script))
    (srv,) = server_side(aws_cloud, "lease-8")
    assert base64.b64decode(srv["user_data_b64"]).decode() == script


def test_oversized_boot_script_is_refused_before_calling_ec2(aws_cloud):
    with pytest.raises(InvalidRequestError) as e:
        make_provider(aws_cloud).launch(spec("lease-9", boot_script="#" * (16 * 1024 + 1)))
    assert e.value.code == "UserDataTooLarge"
    assert aws_cloud.count("RunInstances") == 0


def test_network_storage_and_zone_settings_reach_ec2(aws_cloud):
    ec2 = aws_cloud.client("us-east-1")
    subnets = {s["AvailabilityZone"]: s["SubnetId"] for s in ec2.describe_subnets()["Subnets"]}
    sg = ec2.create_security_group(GroupName="burst", Description="burst nodes")["GroupId"]
    p = make_provider(aws_cloud, subnet_ids={"us-east-1": {"us-east-1d": subnets["us-east-1d"]}},
                      security_group_ids=[sg], key_name="ops", root_volume_gb=200)
    out = p.launch(spec("lease-10"))

    assert out[0].zone == "us-east-1d"
    (params,) = run_calls(aws_cloud)
    assert params["SubnetId"] == subnets["us-east-1d"]
    assert params["SecurityGroupId.1"] == sg and params["KeyName"] == "ops"
    assert params["BlockDeviceMapping.1.DeviceName"] == "/dev/sda1"
    assert params["BlockDeviceMapping.1.Ebs.VolumeSize"] == "200"
    assert params["BlockDeviceMapping.1.Ebs.DeleteOnTermination"] == "true"


def test_default_zone_is_the_first_configured_zone_offering_the_type(aws_cloud):
    # moto's offerings data: p4d.24xlarge is sold in us-east-1a..d, not in us-east-1f.
    p = make_provider(aws_cloud, zones={"us-east-1": ["us-east-1f", "us-east-1c", "us-east-1a"]})
    out = p.launch(spec("lease-11", it=P4D))
    assert out[0].zone == "us-east-1c"
    assert run_calls(aws_cloud)[0]["Placement.AvailabilityZone"] == "us-east-1c"


def test_explicit_zone_and_second_region(aws_cloud):
    p = make_provider(aws_cloud, regions=("us-east-1", "us-west-2"))
    out = p.launch(spec("lease-12", region="us-west-2", zone="us-west-2b"))
    assert out[0].region == "us-west-2" and out[0].zone == "us-west-2b"
    assert [i["region"] for i in server_side(aws_cloud, "lease-12")] == ["us-west-2"]


def test_bad_specs_are_refused_without_calling_ec2(aws_cloud):
    p = make_provider(aws_cloud)
    good = spec("lease-13", count=2)
    for bad, code in [
        (LaunchSpec(**{**_fields(good), "node_names": ("a",)}), "BadNodeCount"),
        (LaunchSpec(**{**_fields(good), "node_names": ("a", "a")}), "BadNodeNames"),
        (LaunchSpec(**{**_fields(good), "provider": "gcp"}), "WrongProvider"),
        (LaunchSpec(**{**_fields(good), "region": "eu-west-1"}), "NoImageForRegion"),
    ]:
        with pytest.raises(InvalidRequestError) as e:
            p.launch(bad)
        assert e.value.code == code
    assert aws_cloud.count("RunInstances") == 0


def _fields(s: LaunchSpec) -> dict:
    return {f: getattr(s, f) for f in s.__dataclass_fields__}


# --- idempotency -------------------------------------------------------------------------------


def test_retry_returns_the_same_instances_and_launches_nothing(aws_cloud):
    p = make_provider(aws_cloud)
    first = p.launch(spec("lease-20", count=2, market=Market.SPOT, it=P4D))
    second = p.launch(spec("lease-20", count=2, market=Market.SPOT, it=P4D))
    again = make_provider(aws_cloud).launch(spec("lease-20", count=2, market=Market.SPOT, it=P4D))

    ids = [i.instance_id for i in first]
    assert [i.instance_id for i in second] == ids == [i.instance_id for i in again]
    assert [i.node_name for i in second] == ["lease-20-n1", "lease-20-n2"]
    assert aws_cloud.count("RunInstances") == 1
    assert len(server_side(aws_cloud, "lease-20")) == 2


def test_timed_out_launch_is_adopted_on_retry(aws_cloud):
    aws_cloud.slow_s = 1.5
    aws_cloud.inject("slow", match="RunInstances")
    p = make_provider(aws_cloud, read_timeout_s=0.5)
    with pytest.raises(TransientError) as e:
        p.launch(spec("lease-21", count=2))
    assert e.value.code == "ReadTimeoutError" and e.value.retryable

    made = server_side(aws_cloud, "lease-21")
    assert len(made) == 2  # EC2 did launch; only the answer was lost
    out = p.launch(spec("lease-21", count=2))
    assert sorted(i.instance_id for i in out) == sorted(m["id"] for m in made)
    assert sorted(i.node_name for i in out) == ["lease-21-n1", "lease-21-n2"]
    assert aws_cloud.count("RunInstances") == 1
    assert len(server_side(aws_cloud, "lease-21")) == 2


def test_client_token_is_ec2s_idempotency_key(aws_cloud):
    """Even when the tag lookup misses, EC2's ClientToken prevents a second set of instances."""
    p = make_provider(aws_cloud)
    s = spec("lease-22", count=2)
    p.launch(s)
    ec2 = aws_cloud.client("us-east-1")
    ids = sorted(i["id"] for i in server_side(aws_cloud, "lease-22"))
    ec2.delete_tags(Resources=ids, Tags=[{"Key": TAG_LEASE}])  # the lookup can no longer find them
    with pytest.raises(InvalidRequestError) as e:  # same token, other parameters: EC2 refuses
        p.launch(spec("lease-22", count=2, tags={"x": "y"}))
    assert e.value.code == "IdempotentParameterMismatch"
    p.launch(s)  # same token, same parameters: EC2 answers with the first launch
    assert sorted(i["id"] for i in aws_cloud.instances()) == ids


def test_long_client_tokens_are_hashed_deterministically():
    s = spec("lease-23", client_token="x" * 100)
    assert client_token(s) == client_token(s) and len(client_token(s)) <= 64
    assert client_token(spec("lease-23", client_token="short")) == "short"


# --- failures ----------------------------------------------------------------------------------

ERROR_CASES = [
    ("capacity", "InsufficientInstanceCapacity", CapacityError, Scope.ZONE),
    ("quota", "InstanceLimitExceeded", QuotaError, Scope.REGION),
    ("quota", "VcpuLimitExceeded", QuotaError, Scope.REGION),
    ("quota", "MaxSpotInstanceCountExceeded", QuotaError, Scope.REGION),
    ("throttle", "RequestLimitExceeded", ThrottledError, Scope.REGION),
    ("throttle", "Throttling", ThrottledError, Scope.REGION),
    ("auth", "UnauthorizedOperation", AuthError, Scope.CLOUD),
    ("auth", "AuthFailure", AuthError, Scope.CLOUD),
    ("invalid", "InvalidParameterValue", InvalidRequestError, Scope.OFFER),
    ("invalid", "InvalidInstanceType", InvalidRequestError, Scope.OFFER),
    ("invalid", "InvalidParameterCombination", InvalidRequestError, Scope.OFFER),
    ("5xx", "InternalError", TransientError, Scope.REGION),
    ("5xx", "Unavailable", TransientError, Scope.REGION),
]


@pytest.mark.parametrize("kind,code,exc,scope", ERROR_CASES, ids=[c[1] for c in ERROR_CASES])
def test_ec2_errors_map_to_provider_errors(aws_cloud, kind, code, exc, scope):
    aws_cloud.inject(kind, match="RunInstances", code=code)
    with pytest.raises(exc) as e:
        make_provider(aws_cloud).launch(spec("lease-30", zone="us-east-1b"))
    err = e.value
    assert type(err) is exc
    assert (err.code, err.scope, err.provider, err.region, err.zone) == (code, scope, "aws", "us-east-1", "us-east-1b")
    assert err.message  # EC2's own message
    assert aws_cloud.count("RunInstances") == 1  # no SDK retries: failover is decided above
    assert server_side(aws_cloud, "lease-30") == []


def test_default_fault_codes_per_kind(aws_cloud):
    p = make_provider(aws_cloud)
    for kind, exc, code in [("capacity", CapacityError, "InsufficientInstanceCapacity"),
                            ("quota", QuotaError, "VcpuLimitExceeded"),
                            ("throttle", ThrottledError, "RequestLimitExceeded"),
                            ("5xx", TransientError, "InternalError"),
                            ("auth", AuthError, "UnauthorizedOperation")]:
        aws_cloud.inject(kind, match="DescribeInstances")
        with pytest.raises(exc) as e:
            p.describe("lease-31", "us-east-1")
        assert e.value.code == code


def test_real_unknown_instance_type_is_invalid(aws_cloud):
    bogus = InstanceType("aws", "p9.mega", "X", 8, 80, 1, 1, "efa", 1)
    with pytest.raises(InvalidRequestError) as e:
        make_provider(aws_cloud).launch(spec("lease-32", it=bogus, zone="us-east-1a"))
    assert e.value.code.startswith("InvalidInstanceType") and e.value.scope is Scope.OFFER


def test_connection_reset_and_refused_are_transient(aws_cloud):
    aws_cloud.inject("reset", match="DescribeInstances")
    with pytest.raises(TransientError) as e:
        make_provider(aws_cloud).list_managed()
    assert e.value.code in ("ConnectionClosedError", "EndpointConnectionError")

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: nothing listens there
    settings = provider_settings("aws", {**aws_cloud.provider_settings(), "endpoint_url": f"http://127.0.0.1:{port}"})
    with pytest.raises(TransientError) as e:
        AwsProvider(settings, OWNER).describe("lease-33", "us-east-1")
    assert e.value.code == "EndpointConnectionError"


def test_missing_credentials_are_an_auth_error(aws_cloud, monkeypatch):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    p = make_provider(aws_cloud)
    with pytest.raises(AuthError) as e:
        p.describe("lease-34", "us-east-1")
    assert e.value.code == "NoCredentialsError" and e.value.scope is Scope.CLOUD


def test_failed_multi_node_launch_leaves_no_placement_group(aws_cloud):
    aws_cloud.inject("capacity", match="RunInstances")
    with pytest.raises(CapacityError):
        make_provider(aws_cloud).launch(spec("lease-35", count=2, it=P4D))
    assert aws_cloud.count("CreatePlacementGroup") == 1
    assert aws_cloud.placement_groups() == []


def test_partial_lease_is_cleaned_up_on_retry(aws_cloud):
    p = make_provider(aws_cloud)
    out = p.launch(spec("lease-36", count=2, market=Market.SPOT, it=P4D))
    aws_cloud.interrupt(out[0].instance_id)

    with pytest.raises(CapacityError) as e:
        p.launch(spec("lease-36", count=2, market=Market.SPOT, it=P4D))
    assert e.value.code == "Server.SpotInstanceTermination" and e.value.zone == out[0].zone
    assert {s["state"] for s in server_side(aws_cloud, "lease-36")} == {"terminated"}
    assert aws_cloud.count("RunInstances") == 1
    assert aws_cloud.placement_groups() == []

    # The lifecycle's retry of the same lease and token starts a fresh set, once.
    again = p.launch(spec("lease-36", count=2, market=Market.SPOT, it=P4D))
    assert {i.state for i in again} <= {InstanceState.PENDING, InstanceState.RUNNING}
    assert not {i.instance_id for i in again} & {i.instance_id for i in out}
    p.launch(spec("lease-36", count=2, market=Market.SPOT, it=P4D))
    assert aws_cloud.count("RunInstances") == 2
    live = [s for s in server_side(aws_cloud, "lease-36") if s["state"] == "running"]
    assert len(live) == 2 and {s["client_token"] for s in live} != {"tok-lease-36"}


def test_relaunch_after_every_node_was_interrupted(aws_cloud):
    p = make_provider(aws_cloud)
    first = p.launch(spec("lease-37", market=Market.SPOT))
    aws_cloud.interrupt(first[0].instance_id)
    second = p.launch(spec("lease-37", market=Market.SPOT))
    assert second[0].instance_id != first[0].instance_id and second[0].node_name == "lease-37-n1"
    assert p.launch(spec("lease-37", market=Market.SPOT))[0].instance_id == second[0].instance_id
    assert aws_cloud.count("RunInstances") == 2


def test_partly_listed_lease_is_retried_not_torn_down(aws_cloud):
    p = make_provider(aws_cloud)
    out = p.launch(spec("lease-38", count=2))
    aws_cloud.client().delete_tags(Resources=[out[1].instance_id], Tags=[{"Key": TAG_LEASE}])
    with pytest.raises(TransientError) as e:  # as if EC2's eventually consistent reads lagged
        p.launch(spec("lease-38", count=2))
    assert e.value.code == "IncompleteView"
    assert {s["state"] for s in server_side(aws_cloud, "lease-38")} == {"running"}


@pytest.mark.parametrize("state,code,expected_state,reason", [
    ("running", "", InstanceState.RUNNING, StopReason.NONE),
    ("pending", "", InstanceState.PENDING, StopReason.NONE),
    ("shutting-down", "Server.SpotInstanceTermination", InstanceState.STOPPING, StopReason.INTERRUPTED),
    ("terminated", "Server.SpotInstanceShutdown", InstanceState.TERMINATED, StopReason.INTERRUPTED),
    ("terminated", "Client.UserInitiatedShutdown", InstanceState.TERMINATED, StopReason.USER),
    ("terminated", "Client.InstanceInitiatedShutdown", InstanceState.TERMINATED, StopReason.USER),
    ("terminated", "Server.InsufficientInstanceCapacity", InstanceState.TERMINATED, StopReason.CAPACITY),
    ("terminated", "Server.InternalError", InstanceState.TERMINATED, StopReason.ERROR),
    ("stopped", "Client.VolumeLimitExceeded", InstanceState.STOPPING, StopReason.ERROR),
    ("terminated", "Something.New", InstanceState.TERMINATED, StopReason.ERROR),
])
def test_state_and_stop_reason_mapping(state, code, expected_state, reason):
    p = AwsProvider(provider_settings("aws", BASE), OWNER)
    inst = p.to_instance("us-east-1", {
        "InstanceId": "i-1", "InstanceType": "p5.48xlarge", "State": {"Name": state},
        "StateReason": {"Code": code}, "Placement": {"AvailabilityZone": "us-east-1a"},
        "Tags": [{"Key": TAG_LEASE, "Value": "L"}, {"Key": "Name", "Value": "n1"}],
    })
    assert (inst.state, inst.stop_reason) == (expected_state, reason)
    assert inst.stop_detail == (code if reason is not StopReason.NONE else "")
    assert (inst.lease_id, inst.node_name, inst.market) == ("L", "n1", Market.ON_DEMAND)


def test_map_error_passes_provider_errors_through():
    err = CapacityError("x", provider="aws")
    assert map_error(err) is err


# --- describe, interruption, list, terminate ---------------------------------------------------


def test_interruption_is_reported(aws_cloud):
    p = make_provider(aws_cloud)
    out = p.launch(spec("lease-40", count=2, market=Market.SPOT, it=P4D))
    aws_cloud.interrupt(out[1].instance_id)
    got = {i.instance_id: i for i in p.describe("lease-40", "us-east-1")}
    hit = got[out[1].instance_id]
    assert hit.state is InstanceState.TERMINATED and hit.stop_reason is StopReason.INTERRUPTED
    assert hit.stop_detail == "Server.SpotInstanceTermination" and hit.market is Market.SPOT
    other = got[out[0].instance_id]
    assert other.state is InstanceState.RUNNING and other.stop_reason is StopReason.NONE
    with pytest.raises(ValueError):
        aws_cloud.interrupt(p.launch(spec("lease-41"))[0].instance_id)  # on-demand: not interruptible


def test_terminate_removes_the_whole_lease_and_is_idempotent(aws_cloud):
    p = make_provider(aws_cloud)
    out = p.launch(spec("lease-42", count=3, it=P4D))
    assert len(aws_cloud.placement_groups()) == 1
    p.terminate(out)

    assert {s["state"] for s in server_side(aws_cloud, "lease-42")} == {"terminated"}
    assert aws_cloud.placement_groups() == []
    described = p.describe("lease-42", "us-east-1")
    assert all(i.state is InstanceState.TERMINATED and i.stop_reason is StopReason.USER for i in described)
    assert {i.stop_detail for i in described} == {"Client.UserInitiatedShutdown"}
    assert p.list_managed() == []

    calls = aws_cloud.count("TerminateInstances")
    p.terminate(out)  # already gone: nothing to do, no error
    p.terminate([])
    assert aws_cloud.count("TerminateInstances") == calls
    ghost = out[0].__class__(**{**_fields(out[0]), "instance_id": "i-0123456789abcdef0"})
    p.terminate([ghost])  # never existed: fine


def test_ec2_forgets_a_terminated_instance_after_the_retention(aws_cloud):
    """EC2 lists a terminated instance for a while (about an hour), then forgets it; the mocked EC2
    does too, so a long run's DescribeInstances does not scan every instance it ever launched."""
    from botocore.exceptions import ClientError

    p = make_provider(aws_cloud)
    gone, kept = p.launch(spec("lease-50", count=2))
    ec2 = aws_cloud.client()
    ec2.terminate_instances(InstanceIds=[gone.instance_id])
    assert {i.instance_id: i.state for i in p.describe("lease-50", "us-east-1")} == {
        gone.instance_id: InstanceState.TERMINATED, kept.instance_id: InstanceState.RUNNING}  # within it

    aws_cloud.terminated_retention_s = 0.2
    deadline = time.monotonic() + 30
    while gone.instance_id in {i.instance_id for i in p.describe("lease-50", "us-east-1")}:
        assert time.monotonic() < deadline, "a terminated instance is still listed long after its retention"
        time.sleep(0.05)

    assert [i.instance_id for i in p.describe("lease-50", "us-east-1")] == [kept.instance_id]
    assert gone.instance_id not in {i["id"] for i in aws_cloud.instances()}
    with pytest.raises(ClientError) as e:
        ec2.terminate_instances(InstanceIds=[gone.instance_id])
    assert e.value.response["Error"]["Code"] == "InvalidInstanceID.NotFound"
    p.terminate([gone, kept])  # a forgotten instance is no error; the other one is terminated
    assert [c.params["InstanceId.1"] for c in aws_cloud.calls
            if c.action == "TerminateInstances" and c.status == 200][-1] == kept.instance_id


def test_a_release_describes_only_its_lease_and_its_instance_ids(aws_cloud):
    """What a release asks EC2 (describe the lease, terminate what it found) is scoped to the lease's
    tag or to the instance ids: never every instance of a region, whatever the region holds."""
    p = make_provider(aws_cloud)
    other = p.launch(spec("lease-51"))
    out = p.launch(spec("lease-52", count=2))
    before = len(aws_cloud.calls)
    p.terminate(p.describe("lease-52", "us-east-1"))
    describes = [c.params for c in aws_cloud.calls[before:] if c.action == "DescribeInstances"]
    assert describes
    for params in describes:
        filters = {params[k]: sorted(v for kk, v in params.items() if kk.startswith(k.rsplit(".", 1)[0] + ".Value."))
                   for k in params if k.startswith("Filter.") and k.endswith(".Name")}
        assert (filters.get(f"tag:{TAG_LEASE}") == ["lease-52"]
                or filters.get("instance-id") == sorted(i.instance_id for i in out)), params
    assert [c.params["InstanceId.1"] for c in aws_cloud.calls[before:] if c.action == "TerminateInstances"]
    assert p.describe("lease-51", "us-east-1")[0].state is InstanceState.RUNNING
    assert other[0].instance_id not in {v for c in aws_cloud.calls[before:] for v in c.params.values()}


def test_the_network_interface_ec2_made_for_an_instance_ends_with_it(aws_cloud):
    """EC2 deletes the primary interface it created at launch when the instance terminates, and
    frees its address: launches never run a subnet out of addresses however many came before."""
    p = make_provider(aws_cloud)
    ec2 = aws_cloud.client()
    before = {n["NetworkInterfaceId"] for n in ec2.describe_network_interfaces()["NetworkInterfaces"]}
    out = p.launch(spec("lease-53", count=2))
    during = {n["NetworkInterfaceId"] for n in ec2.describe_network_interfaces()["NetworkInterfaces"]}
    assert len(during - before) == 2
    p.terminate(out)
    after = {n["NetworkInterfaceId"] for n in ec2.describe_network_interfaces()["NetworkInterfaces"]}
    assert after == before
    # Terminating a terminated instance again is a success in EC2 (a release retried), its
    # interfaces long gone.
    again = ec2.terminate_instances(InstanceIds=[i.instance_id for i in out])["TerminatingInstances"]
    assert {t["CurrentState"]["Name"] for t in again} <= {"shutting-down", "terminated"}
    p.terminate(out)


def test_ec2_retention_is_configured_by_the_environment(monkeypatch):
    from broker_sandbox.aws import RETENTION_ENV, TERMINATED_RETENTION_S

    monkeypatch.delenv(RETENTION_ENV, raising=False)
    assert AwsCloud().terminated_retention_s == TERMINATED_RETENTION_S == 3600
    monkeypatch.setenv(RETENTION_ENV, "90")
    assert AwsCloud().terminated_retention_s == 90
    assert AwsCloud(terminated_retention_s=5).terminated_retention_s == 5
    monkeypatch.setenv(RETENTION_ENV, "-1")
    with pytest.raises(ValueError, match="terminated_retention_s"):
        AwsCloud()


def test_terminate_waits_bounded(aws_cloud):
    p = make_provider(aws_cloud, terminate_timeout_s=0.3)
    out = p.launch(spec("lease-43"))
    region, inst = aws_cloud._instance(out[0].instance_id)
    inst._state.name = "shutting-down"  # stuck in EC2: never reaches terminated
    with pytest.raises(TransientError) as e:
        p.terminate(out)
    assert e.value.code == "TerminateTimeout" and out[0].instance_id in e.value.message


def test_list_managed_pages_and_ignores_other_owners(aws_cloud):
    mine = make_provider(aws_cloud, regions=("us-east-1", "us-west-2"), page_size=5)
    theirs = make_provider(aws_cloud, owner="someone-else")
    ids = set()
    for n in range(7):  # seven reservations: two pages of five in us-east-1
        ids |= {i.instance_id for i in mine.launch(spec(f"east-{n}"))}
    ids |= {i.instance_id for i in mine.launch(spec("west", count=2, region="us-west-2"))}
    theirs.launch(spec("foreign", count=2))
    aws_cloud.client("us-east-1").run_instances(ImageId="ami-12345678", InstanceType="g5.xlarge",
                                                MinCount=1, MaxCount=1)  # untagged
    gone = mine.launch(spec("gone"))
    mine.terminate(gone)

    before = len(aws_cloud.calls)
    listed = mine.list_managed()
    assert {i.instance_id for i in listed} == ids
    assert all(i.lease_id for i in listed)
    assert {i.region for i in listed} == {"us-east-1", "us-west-2"}
    pages = [c for c in aws_cloud.calls[before:] if c.action == "DescribeInstances"]
    assert [c.params["MaxResults"] for c in pages] == ["5"] * 3  # us-east-1: 5 + 2, us-west-2: 1
    assert [c.region for c in pages] == ["us-east-1", "us-east-1", "us-west-2"]
    assert {i.instance_id for i in mine.list_managed(["us-west-2"])} == {
        i.instance_id for i in listed if i.region == "us-west-2"}
    assert {i.lease_id for i in theirs.list_managed()} == {"foreign"}


def test_random_faults_are_reproducible(aws_cloud):
    p = make_provider(aws_cloud)
    aws_cloud.fail_rate(1.0, kinds=["throttle"], seed=7, match="DescribeInstances")
    with pytest.raises(ThrottledError):
        p.list_managed()
    aws_cloud.fail_rate(0.0)
    assert p.list_managed() == []
    with pytest.raises(ValueError):
        aws_cloud.fail_rate(0.5, kinds=["meteor"])


# --- configuration -----------------------------------------------------------------------------

BASE = {"regions": ["us-east-1"], "image_id": "ami-0abc12345def67890"}


@pytest.mark.parametrize("override,key", [
    ({"regions": None}, "providers.aws.regions"),
    ({"regions": "us-east-1"}, "providers.aws.regions"),
    ({"regions": ["narnia"]}, "providers.aws.regions"),
    ({"regions": []}, "providers.aws.regions"),
    ({"image_id": None}, "providers.aws.image_id"),
    ({"image_id": "ubuntu"}, "providers.aws.image_id"),
    ({"image_id": {"us-west-2": "ami-0abc12345def67890"}}, "providers.aws.image_id"),
    ({"endpoint_url": "ftp://x"}, "providers.aws.endpoint_url"),
    ({"credentials": "root"}, "providers.aws.credentials"),
    ({"subnet_ids": {"us-east-1": "net-1"}}, "providers.aws.subnet_ids.us-east-1"),
    ({"subnet_ids": {"us-east-1": {"eu-west-1a": "subnet-0abc1234"}}}, "providers.aws.subnet_ids.us-east-1"),
    ({"zones": {"us-east-1": ["eu-west-1a"]}}, "providers.aws.zones.us-east-1"),
    ({"security_group_ids": ["default"]}, "providers.aws.security_group_ids"),
    ({"root_volume_gb": -1}, "providers.aws.root_volume_gb"),
    ({"root_volume_gb": True}, "providers.aws.root_volume_gb"),
    ({"read_timeout_s": 0}, "providers.aws.read_timeout_s"),
    ({"connect_timeout_s": "5"}, "providers.aws.connect_timeout_s"),
    ({"terminate_timeout_s": 99999}, "providers.aws.terminate_timeout_s"),
    ({"enabled": "yes"}, "providers.aws.enabled"),
    ({"iam_instance_profile": "bad name!"}, "providers.aws.iam_instance_profile"),
])
def test_malformed_config_names_the_key(override, key):
    settings = {**BASE, **override}
    settings = {k: v for k, v in settings.items() if v is not None}
    with pytest.raises(ValueError) as e:
        AwsProvider.from_config(settings, owner=OWNER)
    assert key in str(e.value)


def test_valid_config_variants():
    p = AwsProvider.from_config({
        **BASE, "enabled": True, "regions": ["us-east-1", "eu-west-1"],
        "image_id": {"us-east-1": "ami-0abc12345def67890", "eu-west-1": "ami-0123456789abcdef0"},
        "subnet_ids": {"us-east-1": "subnet-0abc1234", "eu-west-1": {"eu-west-1a": "subnet-0def5678"}},
        "security_group_ids": {"us-east-1": ["sg-0abc1234"]}, "iam_instance_profile": "gpu-node",
    }, owner=OWNER)
    assert p.name == "aws" and p.settings.image_for("eu-west-1") == "ami-0123456789abcdef0"
    assert p.settings.security_groups_for("eu-west-1") == ()
    with pytest.raises(ValueError):
        AwsProvider.from_config(BASE, owner="")


@pytest.mark.parametrize("endpoint", ["", "https://ec2.us-east-1.amazonaws.com", "http://10.0.0.5:5000"])
def test_anonymous_credentials_need_a_loopback_endpoint(endpoint):
    with pytest.raises(ValueError) as e:
        AwsProvider.from_config({**BASE, "credentials": "anonymous", "endpoint_url": endpoint}, owner=OWNER)
    assert "providers.aws.credentials" in str(e.value)


def test_anonymous_credentials_work_on_loopback(aws_cloud, monkeypatch):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    settings = {**aws_cloud.provider_settings(("us-east-1", "us-west-2")), "credentials": "anonymous"}
    p = AwsProvider.from_config(settings, owner=OWNER)
    out = p.launch(spec("lease-50", region="us-west-2"))
    assert out[0].zone.startswith("us-west-2")
    assert [i["region"] for i in server_side(aws_cloud, "lease-50")] == ["us-west-2"]


def test_another_process_can_drive_the_mocked_cloud(aws_cloud):
    """The chaos tests run the broker as a subprocess against this cloud: only the URL and env cross."""
    settings = aws_cloud.provider_settings()
    code = (
        "import json, sys\n"
        "from providers.aws import AwsProvider\n"
        "from providers.base import InstanceType, LaunchSpec, Market\n"
        "p = AwsProvider.from_config(json.loads(sys.argv[1]), owner='child')\n"
        "it = InstanceType('aws', 'g5.xlarge', 'A10G', 1, 24, 4, 16, 'ethernet', 10)\n"
        "out = p.launch(LaunchSpec('child-lease', 'aws', 'us-east-1', '', it, Market.ON_DEMAND, 1, 't', ('c1',)))\n"
        "print(out[0].instance_id)\n"
    )
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("AWS_")}, **AwsCloud.client_env()}
    root = Path(__file__).resolve().parents[1]
    result = subprocess.run([sys.executable, "-c", code, json.dumps(settings)], env=env, cwd=root,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    (srv,) = server_side(aws_cloud, "child-lease")
    assert srv["id"] == result.stdout.strip().splitlines()[-1] and srv["tags"][TAG_OWNER] == "child"


@pytest.mark.parametrize("kind,status", [("html", 502), ("garbage", 200)])
def test_an_answer_that_is_no_aws_answer_is_a_transient_error_naming_the_status(aws_cloud, kind, status):
    """A proxy's HTML error page (or garbage) instead of EC2's XML was raised by botocore as an
    untyped parser error: the broker said "internal error" and left the lease provisioning."""
    p = make_provider(aws_cloud)
    aws_cloud.inject(kind, times=0, match="DescribeInstances")
    with pytest.raises(TransientError) as e:
        p.list_managed()
    err = e.value
    assert err.retryable and err.code == f"HTTP{status}" and err.provider == "aws"
    assert f"HTTP {status}" in str(err) and "<" not in str(err) and len(str(err)) < 300
    aws_cloud.clear_faults()
    aws_cloud.inject(kind, match="RunInstances")
    with pytest.raises(TransientError) as e:
        p.launch(spec("lease-html", zone="us-east-1a"))
    assert e.value.code == f"HTTP{status}"
