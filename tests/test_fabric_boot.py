"""The boot script sets the NCCL environment for the fabric the node's launch wired, from its
cloud's boot hooks, and nothing for Ethernet; the container template passes it into the job."""
from __future__ import annotations

import subprocess

import pytest

from providers.base import Fabric
from providers.bootstrap import render
from tests.test_bootstrap import RECORD, SETTINGS, ctx, recorded, run

FI = ("FI_PROVIDER", "FI_EFA_USE_DEVICE_RDMA")


def test_efa_node_runs_its_job_with_libfabric_on_efa(tmp_path):
    script = render("container", ctx(provider="aws", fabric=Fabric.EFA))
    result = run(script, tmp_path, {"docker": RECORD + "exit 0\n"})
    assert result.returncode == 0, result.stderr
    args, env = recorded(tmp_path, "docker")
    assert env["FI_PROVIDER"] == "efa" and env["FI_EFA_USE_DEVICE_RDMA"] == "1"
    for name in FI:
        assert ["-e", name] == args[args.index(name) - 1: args.index(name) + 1]


def test_ethernet_node_gets_no_fabric_environment(tmp_path):
    script = render("container", ctx(provider="aws"))
    assert "FI_PROVIDER" not in script and "NCCL_" not in script
    result = run(script, tmp_path, {"docker": RECORD + "exit 0\n"})
    assert result.returncode == 0, result.stderr
    args, env = recorded(tmp_path, "docker")
    assert not any(k.startswith(("FI_", "NCCL_")) for k in env) and "FI_PROVIDER" not in args


def _exports(script_env: str, tmp_path, names: tuple[str, ...]) -> dict[str, str]:
    """Run the rendered environment section of a slurm script and read back ``names``."""
    path = tmp_path / "env.sh"
    path.write_text(script_env + "\n" + "".join(f'echo "{n}=${{{n}}}"\n' for n in names))
    out = subprocess.run(["bash", str(path)], capture_output=True, text=True, timeout=30, check=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines())


@pytest.mark.parametrize("provider,fabric,expect", [
    ("gcp", Fabric.TCPX, {"NCCL_GPUDIRECTTCPX_CTRL_DEV": "lo-less"}),
    ("gcp", Fabric.TCPXO, {"NCCL_FASTRAK_CTRL_DEV": "lo-less"}),
    ("azure", Fabric.INFINIBAND, {"NCCL_IB_HCA": "mlx5_ib"}),
])
def test_gpudirect_and_infiniband_nodes_export_their_nccl_settings(tmp_path, provider, fabric, expect):
    script = render("slurm", ctx(provider=provider, region="r", fabric=fabric, settings=SETTINGS))
    start = script.index("# " + fabric.value + ": ")
    section = script[start:script.index("\n", script.index("broker_fabric_vars=", start))]
    got = _exports(section, tmp_path, (*expect, "broker_fabric_vars"))
    for name, value in expect.items():
        if value == "lo-less":  # the first network interface by name, never loopback
            assert got[name] and got[name] != "lo"
        else:
            assert got[name] == value
        assert name in got["broker_fabric_vars"].split()


def test_a_cloud_without_that_fabric_sets_nothing(tmp_path):
    script = render("slurm", ctx(provider="lambda", region="us-east-1", fabric=Fabric.EFA, settings=SETTINGS))
    assert "FI_PROVIDER" not in script and 'broker_fabric_vars=""' in script


@pytest.mark.parametrize("provider,instance_type,nodes,fabric", [
    ("aws", "p5.48xlarge", 2, Fabric.EFA),
    ("aws", "p5.48xlarge", 1, Fabric.ETHERNET),
    ("gcp", "a3-megagpu-8g", 2, Fabric.TCPXO),
    ("aws", "g5.xlarge", 2, Fabric.ETHERNET),
    ("aws", "no-such-type", 2, Fabric.ETHERNET),
])
def test_the_service_renders_a_lease_with_its_catalog_rows_fabric(provider, instance_type, nodes, fabric):
    from types import SimpleNamespace

    from broker.service import Service
    from providers.catalog import bundled

    service = SimpleNamespace(engine=SimpleNamespace(catalog=bundled()))
    lease = SimpleNamespace(provider=provider, instance_type=instance_type)
    assert Service._fabric(service, lease, nodes) is fabric
