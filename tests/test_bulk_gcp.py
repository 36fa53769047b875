"""Several shapes on Compute Engine: one regional ``bulkInsert`` per machine type across the shapes'
zones, read off the mocked cloud's request log; the gang all in one zone or none of it, its GPU
NICs and compact placement carried by ``instanceProperties``."""
from __future__ import annotations

import pytest

from providers.base import Market, NoShapeAvailable, Shape, ShapesProvider
from providers.catalog import bundled
from providers.gcp import GcpProvider
from tests.clouds.gcp import FakeGcpCompute, fake_gcp  # noqa: F401  (fixture)
from tests.test_provider_gcp import OWNER, REGION, settings, spec

A3 = bundled().instance("gcp", "a3-highgpu-8g")
A2 = bundled().instance("gcp", "a2-highgpu-1g")


def provider(fake: FakeGcpCompute) -> GcpProvider:
    return GcpProvider.from_config(settings(fake.url), owner=OWNER)


def bulk_calls(fake: FakeGcpCompute) -> list[dict]:
    return [c.body for c in fake.calls_to("POST", "/instances/bulkInsert")]


def alive(fake: FakeGcpCompute) -> list[dict]:
    return [i for i in fake.instances() if i.get("status") not in ("TERMINATED", "STOPPING")]


def test_gcp_is_a_shapes_provider(fake_gcp):
    assert isinstance(provider(fake_gcp), ShapesProvider)


def test_one_type_in_two_zones_is_one_bulk_insert_across_them(fake_gcp):
    fake_gcp.set_capacity("a2-highgpu-1g", "us-central1-b", 0)
    shapes = [Shape(A2, "us-central1-b", Market.ON_DEMAND), Shape(A2, "us-central1-c", Market.ON_DEMAND)]
    got, nodes = provider(fake_gcp).launch_shapes(spec("lease-b1", it=A2, count=2), shapes)
    assert got == shapes[1]
    assert {(n.zone, n.instance_type) for n in nodes} == {("us-central1-c", "a2-highgpu-1g")}
    (body,) = bulk_calls(fake_gcp)
    assert fake_gcp.calls_to("POST", "/instances") == []
    assert (body["count"], body["minCount"]) == ("2", "2")
    assert sorted(body["locationPolicy"]["locations"]) == ["zones/us-central1-b", "zones/us-central1-c"]
    assert body["locationPolicy"]["targetShape"] == "ANY_SINGLE_ZONE"
    assert sorted(body["perInstanceProperties"]) == ["lease-b1-n0", "lease-b1-n1"]
    assert body["instanceProperties"]["machineType"] == "a2-highgpu-1g"
    (op,) = [o for o in fake_gcp.operations() if o["operationType"] == "bulkInsert"]
    assert op["instancesBulkInsertOperationMetadata"]["perLocationStatus"]["zones/us-central1-c"][
        "createdVmCount"] == 2


def test_a_type_out_of_capacity_in_every_zone_yields_the_next_type(fake_gcp):
    fake_gcp.set_capacity("a3-highgpu-8g", "", 1)  # fewer than the gang
    shapes = [Shape(A3, "us-central1-b", Market.ON_DEMAND), Shape(A2, "us-central1-b", Market.ON_DEMAND)]
    got, nodes = provider(fake_gcp).launch_shapes(spec("lease-b2", it=A3, count=2), shapes)
    assert got == shapes[1] and len(nodes) == 2
    first, second = bulk_calls(fake_gcp)
    assert first["instanceProperties"]["machineType"] == "a3-highgpu-8g"
    assert second["instanceProperties"]["machineType"] == "a2-highgpu-1g"
    assert {i["name"] for i in alive(fake_gcp)} == {"lease-b2-n0", "lease-b2-n1"}


def test_every_type_refused_names_each_with_computes_code(fake_gcp):
    fake_gcp.set_capacity("a3-highgpu-8g", "", 0)
    fake_gcp.set_capacity("a2-highgpu-1g", "", 0)
    shapes = [Shape(A3, "us-central1-b", Market.ON_DEMAND), Shape(A2, "us-central1-c", Market.ON_DEMAND)]
    with pytest.raises(NoShapeAvailable) as e:
        provider(fake_gcp).launch_shapes(spec("lease-b3", it=A3, count=2), shapes)
    assert [(s.instance.name, err.code) for s, err in e.value.failures] == [
        ("a3-highgpu-8g", "ZONE_RESOURCE_POOL_EXHAUSTED"), ("a2-highgpu-1g", "ZONE_RESOURCE_POOL_EXHAUSTED")]
    assert alive(fake_gcp) == [] and fake_gcp.policies() == []


def test_an_a3_gang_bulk_insert_carries_gpu_nics_and_compact_placement(fake_gcp):
    shapes = [Shape(A3, "us-central1-b", Market.ON_DEMAND), Shape(A3, "us-central1-c", Market.ON_DEMAND)]
    provider(fake_gcp).launch_shapes(spec("lease-b4", it=A3, count=2), shapes)
    (body,) = bulk_calls(fake_gcp)
    props = body["instanceProperties"]
    assert [n.get("nicType") for n in props["networkInterfaces"]] == ["GVNIC"] * 5
    assert props["resourcePolicies"] == ["broker-lease-b4"]
    for inst in alive(fake_gcp):
        assert len(inst["networkInterfaces"]) == 5
        (policy,) = inst["resourcePolicies"]
        assert policy.endswith(f"/regions/{REGION}/resourcePolicies/broker-lease-b4")


def test_a_repeated_attempt_gets_the_same_nodes(fake_gcp):
    p = provider(fake_gcp)
    shapes = [Shape(A2, "us-central1-b", Market.ON_DEMAND), Shape(A2, "us-central1-c", Market.ON_DEMAND)]
    first = p.launch_shapes(spec("lease-b5", it=A2, count=2), shapes)
    again = p.launch_shapes(spec("lease-b5", it=A2, count=2), shapes)
    assert [n.instance_id for n in again[1]] == [n.instance_id for n in first[1]]
    assert len(bulk_calls(fake_gcp)) == 1


def test_one_shape_is_an_ordinary_launch(fake_gcp):
    provider(fake_gcp).launch_shapes(spec("lease-b6", it=A2, count=1), [Shape(A2, "us-central1-b", Market.ON_DEMAND)])
    assert bulk_calls(fake_gcp) == [] and len(fake_gcp.calls_to("POST", "/instances")) == 1
