"""GPUDirect at launch on Compute Engine, read off the mocked cloud's insert bodies: a multi-node
A3 gang gets gVNIC, the GPU NICs the catalog gives its type and a compact placement policy by
default; a single node, and an Ethernet gang's NICs, get none of it."""
from __future__ import annotations

import pytest

from providers.base import InvalidRequestError, Market
from providers.catalog import bundled
from providers.gcp import GcpProvider
from providers.settings import SettingsError
from tests.clouds.gcp import FakeGcpCompute, fake_gcp  # noqa: F401  (fixture)
from tests.test_provider_gcp import OWNER, REGION, ZONE, settings, spec

A3 = bundled().instance("gcp", "a3-highgpu-8g")
A3_MEGA = bundled().instance("gcp", "a3-megagpu-8g")
G2 = bundled().instance("gcp", "g2-standard-8")


def provider(fake: FakeGcpCompute, **extra) -> GcpProvider:
    return GcpProvider.from_config(settings(fake.url, **extra), owner=OWNER)


def bodies(fake: FakeGcpCompute) -> list[dict]:
    return [c.body for c in fake.calls_to("POST", "/instances")]


def test_two_node_a3_gang_gets_gvnic_four_gpu_nics_and_compact_placement(fake_gcp):
    provider(fake_gcp).launch(spec("lease-g1", it=A3, count=2))
    sent = bodies(fake_gcp)
    assert len(sent) == 2
    for body in sent:
        nics = body["networkInterfaces"]
        assert [n.get("nicType") for n in nics] == ["GVNIC"] * 5
        assert [n["network"] for n in nics[1:]] == [f"global/networks/broker-gpu-{i}" for i in range(1, 5)]
        assert [n["subnetwork"] for n in nics[1:]] == [
            f"regions/{REGION}/subnetworks/broker-gpu-{i}" for i in range(1, 5)]
        (policy,) = body["resourcePolicies"]
        assert policy.endswith(f"/regions/{REGION}/resourcePolicies/broker-lease-g1")
    (policy,) = fake_gcp.policies()
    assert policy["groupPlacementPolicy"]["collocation"] == "COLLOCATED"


def test_a3_mega_gang_gets_eight_gpu_nics_on_the_configured_networks(fake_gcp):
    provider(fake_gcp, gpu_network_prefix="a3net").launch(spec("lease-g2", it=A3_MEGA, count=2))
    for body in bodies(fake_gcp):
        nets = [n["network"] for n in body["networkInterfaces"][1:]]
        assert nets == [f"global/networks/a3net-{i}" for i in range(1, 9)]


def test_single_node_a3_gets_one_plain_nic_and_no_policy(fake_gcp):
    provider(fake_gcp).launch(spec("lease-g3", it=A3, count=1))
    (body,) = bodies(fake_gcp)
    (nic,) = body["networkInterfaces"]
    assert "nicType" not in nic and not body.get("resourcePolicies") and fake_gcp.policies() == []


def test_ethernet_gang_gets_compact_placement_but_no_gpu_nics(fake_gcp):
    provider(fake_gcp).launch(spec("lease-g4", it=G2, count=2))
    for body in bodies(fake_gcp):
        assert len(body["networkInterfaces"]) == 1 and body["resourcePolicies"]


def test_compact_placement_can_be_turned_off(fake_gcp):
    provider(fake_gcp, compact_placement=False).launch(spec("lease-g5", it=A3, count=2))
    assert fake_gcp.policies() == [] and not any(b.get("resourcePolicies") for b in bodies(fake_gcp))
    assert all(len(b["networkInterfaces"]) == 5 for b in bodies(fake_gcp))


def test_reserved_gang_gets_gpu_nics_but_no_placement_policy(fake_gcp):
    fake_gcp.add_reservation(ZONE, "team-a3", "a3-highgpu-8g", 2)
    provider(fake_gcp).launch(spec("lease-g6", it=A3, count=2, zone=ZONE, market=Market.RESERVED,
                                   reservation="team-a3"))
    assert fake_gcp.policies() == []
    assert all(len(b["networkInterfaces"]) == 5 and not b.get("resourcePolicies") for b in bodies(fake_gcp))


def test_mocked_compute_refuses_more_nics_than_a3_takes(fake_gcp):
    from dataclasses import replace

    too_many = replace(A3, fabric_nics=9)
    with pytest.raises(InvalidRequestError):
        provider(fake_gcp).launch(spec("lease-g7", it=too_many, count=2))


def test_bad_gpu_network_prefix_is_refused_naming_the_key(fake_gcp):
    with pytest.raises(SettingsError, match="gpu_network_prefix"):
        provider(fake_gcp, gpu_network_prefix="Bad_Prefix")
