"""Hostile requests at the API's edge: no server files through the API, bounded sizes and ranges,
and no internal error text in any answer."""
from __future__ import annotations

import grpc
import pytest

from broker.v1 import broker_pb2 as pb
from broker.v1 import broker_pb2_grpc as pb_grpc
from providers.bootstrap import BUILTINS, BootstrapError, resolve
from providers.registry import build_enabled
from tests.clouds.gcp import FakeGcpCompute
from tests.grpc_server import running_server

pytestmark = pytest.mark.timeout(120)

SECRET = "AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
CONTAINER = {"image": "registry.example/train:1", "command": ["python", "train.py"]}


@pytest.fixture(scope="module")
def gcp_cloud():
    with FakeGcpCompute() as fake:
        yield fake


@pytest.fixture
def gcp_broker(gcp_cloud, tmp_path, mini_catalog_dir):
    """A server on the mocked GCP with boot scripts configured, and one operator template."""
    gcp_cloud.reset()
    operator_template = tmp_path / "ops" / "gpu-train.sh"
    operator_template.parent.mkdir()
    operator_template.write_text("#!/bin/sh\necho operator template for $lease_id\n")
    table = {"gcp": {"enabled": True, "project": "test-project", "regions": ["us-central1"],
                     "api_endpoint": gcp_cloud.url, "credentials": "anonymous", "timeout_s": 5}}
    cfg = {"catalog.path": str(mini_catalog_dir), "providers": table,
           "bootstrap": {"container": CONTAINER, "templates": {"gpu-train": str(operator_template)}}}
    with running_server(tmp_path, providers=build_enabled(table, "broker-test"), config=cfg) as (addr, svc):
        with grpc.insecure_channel(addr) as ch:
            yield pb_grpc.BrokerStub(ch), svc, gcp_cloud


def _launch(stub, key: str, bootstrap: str):
    return stub.Launch(pb.LaunchRequest(
        idempotency_key=key, bootstrap=bootstrap,
        offering=pb.Offering(provider="gcp", region="us-central1", instance_type="a2-highgpu-1g",
                             market=pb.MARKET_ON_DEMAND, count=1)))


def _startup_scripts(cloud) -> list[str]:
    return [item["value"] for inst in cloud.instances()
            for item in (inst.get("metadata") or {}).get("items", []) if item["key"] == "startup-script"]


def test_a_client_cannot_name_a_server_file_as_its_boot_template(gcp_broker, tmp_path):
    stub, svc, cloud = gcp_broker
    planted = tmp_path / "planted.sh"
    planted.write_text(f"#!/bin/sh\n{SECRET}\n")
    for name in (str(planted), "../../etc/passwd", "/etc/hostname", "no-such-template"):
        with pytest.raises(grpc.RpcError) as e:
            _launch(stub, f"k-{abs(hash(name))}", name)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, name
        assert "bootstrap" in e.value.details() and "gpu-train" in e.value.details()
    assert cloud.insert_count == 0 and not svc.store.list_leases()
    assert not any(SECRET in s for s in _startup_scripts(cloud))


def test_configured_and_builtin_templates_still_boot(gcp_broker):
    stub, _, cloud = gcp_broker
    lease = _launch(stub, "k-operator", "gpu-train").lease
    assert lease.state == pb.LEASE_STATE_RUNNING
    assert _launch(stub, "k-builtin", "container").lease.state == pb.LEASE_STATE_RUNNING
    scripts = _startup_scripts(cloud)
    assert any(f"operator template for {lease.lease_id}" in s for s in scripts)
    assert any("registry.example/train:1" in s for s in scripts)


def test_resolve_maps_names_to_configured_sources_only(tmp_path):
    assert [resolve(b) for b in BUILTINS] == list(BUILTINS)
    assert resolve("mine", {"mine": "/etc/broker/mine.sh"}) == "/etc/broker/mine.sh"
    assert resolve("slurm", {"slurm": "/etc/broker/slurm-custom.sh"}) == "/etc/broker/slurm-custom.sh"
    with pytest.raises(BootstrapError, match="not configured"):
        resolve(str(tmp_path / "x.sh"), {"mine": "/etc/broker/mine.sh"})
    with pytest.raises(BootstrapError):
        resolve("/etc/broker/mine.sh", {"mine": "/etc/broker/mine.sh"})  # the path is not a name
